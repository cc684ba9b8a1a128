"""Goodput planning: how big this step's tree should be, and whether the draft model runs at all.

Two measured models meet here:

* :class:`CalibratedAcceptance`: the probability that a node is accepted given that its parent is,
  calibrated per source from the run's own history (Beta counts with a prior scaled by the
  source's pooled observed / expected ratio, so it learns fast when guesses keep failing). Model
  nodes are binned by their draft probability ``q``; retrieval nodes by the suffix match length,
  times the branch frequency ``q``. A node's probability of being accepted is the product along
  its path, so the expected number of accepted draft tokens of any tree is
  ``sum(node_probs(tree))``. The drafter owns it (it learns as the drafter commits) and ranks its
  trees' nodes by it (``TreeConfig.admission``); the planner plans with it.
* :class:`talon.cost.model.CostModel`: what verification and drafting cost at each size.

:class:`Planner` maximises a step's goodput, (expected accepted + 1) / (draft + verify + other
time): it stops growing the tree when the next layer's expected tokens do not pay for its draft
forward and its extra verification (``worth_layer``), trims the tree to its most profitable nodes
(``trim``), and in hybrid mode skips the draft model for a step when retrieval alone is expected
to do at least as well per second (``model_decision``); the same reasoning decides when the
draft model's prompt prefill is worth paying at all.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from talon.core.builder import prune
from talon.cost.model import CostModel
from talon.run_config import TreeConfig
from talon.tree import DraftTree

Q_EDGES: tuple[float, ...] = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 0.9, 0.97)  # 11 bins
MATCH_EDGES: tuple[int, ...] = (2, 3, 4, 6, 8, 12, 16)  # 8 bins: <2, 2, 3, 4-5, 6-7, 8-11, 12-15, 16+
PRIOR_STRENGTH = 3.0
# The pooled observed/expected ratio of a source carries this many pseudo-counts: few, so that a
# handful of failed guesses is enough to stop sending them where they cost verification time.
POOL_STRENGTH = 1.0
PRIOR_CAP = 0.95  # no prior, however scaled, promises more than this
EMA = 0.3
EXPLORE_MODEL_STEPS = 3  # an engaged draft model runs this many steps before it may be skipped
LOOKAHEAD = 4  # layers a cost stop looks ahead
MAX_SKIPS_IN_A_ROW = 4  # then it runs once more, so its outlook follows the text (tuned on atlases)
# A draft-model prefill dearer than this many one-token target steps (a long prompt: a document
# to summarise) waits until retrieval alone has run WATCH_STEPS steps, so that the engage
# decision weighs the model's prior against retrieval's measured goodput, not against a guess.
LONG_PREFILL_STEPS = 4
WATCH_STEPS = 6  # tuned on atlases (with ENGAGE_MARGIN): 4 engaged the model on sum's articles too early
# The draft model's gain before it has run is the outlook's prior, not a measurement: its prompt
# prefill is paid only when the predicted saving exceeds it this many times over.
ENGAGE_MARGIN = 4.0


@dataclass
class Beta:
    """A Beta(hits, misses) posterior over an acceptance rate."""

    hits: float
    misses: float

    @staticmethod
    def prior(mean: float, strength: float = PRIOR_STRENGTH) -> "Beta":
        return Beta(mean * strength, (1.0 - mean) * strength)

    @property
    def mean(self) -> float:
        return self.hits / (self.hits + self.misses)

    def add(self, hit: bool) -> None:
        if hit:
            self.hits += 1.0
        else:
            self.misses += 1.0


def _q_centres() -> list[float]:
    edges = (0.0,) + Q_EDGES + (1.0,)
    return [(lo + hi) / 2 for lo, hi in zip(edges, edges[1:])]


def _retrieval_prior(bin_index: int) -> float:
    """Longer suffix matches continue more reliably (SAM-Decoding's observation); a one-token
    match (bin 0, proposed only under a planner) is a weak guess."""
    if bin_index == 0:
        return 0.2
    return min(0.35 + 0.07 * bin_index, 0.85)


@dataclass
class Calibration:
    """P(node accepted | parent accepted) for one source's nodes, in bins (by q, or by match
    length). Each bin is a Beta posterior whose prior mean is the bin's prior times the source's
    pooled observed / expected ratio: hits over all the source's trials, against the hits the
    priors predicted for them (``POOL_STRENGTH`` pseudo-counts on each side). So failures in any
    bin lower every bin at once: after a few rejected guesses a bin never tried does not start
    from its optimistic prior, and a guess that keeps failing stops being sent within a few steps."""

    priors: list[float]
    hits: list[float] = field(default_factory=list)
    trials: list[float] = field(default_factory=list)
    observed: float = 0.0  # hits, all bins
    expected: float = 0.0  # hits the priors predicted for the same trials

    def __post_init__(self) -> None:
        self.hits = self.hits or [0.0] * len(self.priors)
        self.trials = self.trials or [0.0] * len(self.priors)

    @property
    def ratio(self) -> float:
        """The pooled observed / expected ratio, at most 1: pooled evidence only ever makes the
        priors more cautious; a bin becomes more optimistic than its prior on its own hits."""
        return min((self.observed + POOL_STRENGTH) / (self.expected + POOL_STRENGTH), 1.0)

    def rate(self, i: int) -> float:
        prior = min(self.priors[i] * self.ratio, PRIOR_CAP)
        return (self.hits[i] + PRIOR_STRENGTH * prior) / (self.trials[i] + PRIOR_STRENGTH)

    def add(self, i: int, hit: bool, predicted: float) -> None:
        """One trial of bin ``i``; ``predicted``: the priors' P(hit) for it."""
        self.hits[i] += hit
        self.trials[i] += 1.0
        self.observed += hit
        self.expected += predicted


@dataclass
class CalibratedAcceptance:
    """P(node accepted | parent accepted) per source, from this run's accepted/rejected nodes.

    The draft model is over-confident, so its prior is 0.8 q; retrieval's prior grows with the
    match length and is multiplied by the branch frequency q. ``continues`` is P(one of an
    accepted node's model children is accepted): what the planner expects of a layer it has not
    drafted yet.
    """

    model: Calibration = field(default_factory=lambda: Calibration([0.8 * c for c in _q_centres()]))
    both: Calibration = field(default_factory=lambda: Calibration([min(0.9 * c + 0.1, 0.95) for c in _q_centres()]))
    retrieval: Calibration = field(
        default_factory=lambda: Calibration([_retrieval_prior(i) for i in range(len(MATCH_EDGES) + 1)])
    )
    continues: Beta = field(default_factory=lambda: Beta.prior(0.6))
    observed: int = 0

    def _bin(self, node_source: str, q: float, match_len: int, depth: int = 1) -> tuple[Calibration, int]:
        """A retrieval node at ``depth`` is binned by the match it continues once its parent is
        accepted: ``match_len + depth - 1`` tokens (each accepted ancestor lengthens the suffix
        that matched), so a long copied passage earns trust as it goes."""
        if node_source == "retrieval":
            return self.retrieval, bisect.bisect_right(MATCH_EDGES, match_len + depth - 1)
        return (self.both if node_source == "both" else self.model), bisect.bisect_right(Q_EDGES, q)

    def p_cond(self, node_source: str, q: float, match_len: int, depth: int = 1) -> float:
        """P(a node accepted | its parent accepted); ``depth``: the node's depth in its tree."""
        calibration, i = self._bin(node_source, q, match_len, depth)
        rate = calibration.rate(i)
        return min(rate * q, 1.0) if node_source == "retrieval" else rate

    def node_probs(self, tree: DraftTree, match_len: int) -> list[float]:
        """(T,) P(node accepted); the root is 1. Never grows along a path."""
        probs = [1.0]
        for node in range(1, len(tree)):
            p = self.p_cond(tree.sources[node], tree.q_draft[node], match_len, tree.depths[node])
            probs.append(probs[tree.parents[node]] * p)
        return probs

    def observe(self, tree: DraftTree, accepted: list[int], match_len: int) -> None:
        """Every node whose parent was accepted was tested: record whether it was accepted too."""
        on_path = set(accepted)
        for node in range(1, len(tree)):
            if tree.parents[node] in on_path:
                source, q = tree.sources[node], tree.q_draft[node]
                calibration, i = self._bin(source, q, match_len, tree.depths[node])
                predicted = calibration.priors[i] * (q if source == "retrieval" else 1.0)
                calibration.add(i, node in on_path, predicted)
                self.observed += 1
        for node in on_path:
            kids = [c for c in tree.children(node) if tree.sources[c] in ("model", "both")]
            if kids and node != 0:
                self.continues.add(any(c in on_path for c in kids))


@dataclass(frozen=True)
class BestPrefix:
    """The goodput-best prefix of a tree's nodes ranked by acceptance probability."""

    order: list[int]  # draft nodes, most likely first (parents before children)
    nodes: int  # how many of ``order`` to keep
    expected: float  # their expected accepted tokens
    rate: float  # (expected + 1) / predicted step time, tokens/s


@dataclass
class ModelOutlook:
    """Running estimates of a step on which the draft model runs (EMAs over such steps)."""

    accepted: float  # accepted draft tokens only the model proposed
    draft_s: float  # time spent drafting
    nodes: float  # tree nodes
    goodput_without: float | None = None  # tokens/s of steps without the model


def drafting_without_catch_up(forwards: list[tuple[int, float]], costs: CostModel) -> float:
    """Seconds of a step's draft-model forwards ``(tokens fed, seconds)`` as the model outlook
    counts them: the first (the root's) forward also fed the tokens committed while the model
    was skipped, so it is charged at width 1; ``model_decision`` adds the catch-up at hand."""
    seconds = sum(s for _, s in forwards)
    if forwards and forwards[0][0] > 1:
        seconds += costs.draft_s(1) - forwards[0][1]
    return seconds


class Planner:
    """Per-run goodput decisions. ``begin_step`` starts the step's drafting clock; the drafter
    reports each draft forward with ``forward_done``.

    ``predicted=True``: the planner is deterministic: it charges drafting at the cost model's
    prediction for the forwards reported, never reading the wall clock, so the same command gives
    the same trees and a sampled run with a fixed seed, whose random draws depend on the tree, is
    reproducible (the caller also freezes ``costs``)."""

    def __init__(self, costs: CostModel, cfg: TreeConfig, max_new_tokens: int, predicted: bool = False,
                 acceptance: CalibratedAcceptance | None = None) -> None:
        """``acceptance``: the drafter's acceptance model (it learns as the drafter commits); a
        fresh one when not given."""
        self.costs = costs
        self.predicted = predicted
        self.step_widths: list[int] = []  # widths of this step's draft forwards so far
        self.cfg = cfg
        self.acceptance = acceptance if acceptance is not None else CalibratedAcceptance()
        self.remaining = max_new_tokens
        layers = min(cfg.max_depth, 3)
        self.outlook = ModelOutlook(
            accepted=1.5,
            draft_s=costs.draft_s(1) + (layers - 1) * costs.draft_s(cfg.root_k),
            nodes=min(cfg.budget, cfg.root_k * layers),
        )
        self.skips_in_a_row = 0
        self.model_steps = 0
        self.steps_without_model = 0
        self._t0 = time.perf_counter()

    # --- the clock -------------------------------------------------------------------------

    def begin_step(self) -> None:
        self._t0 = time.perf_counter()
        self.step_widths = []

    def forward_done(self, width: int) -> None:
        """The drafter ran one draft forward over ``width`` tokens this step."""
        self.step_widths.append(width)

    def drafted_s(self) -> float:
        if self.predicted:
            return sum(self.costs.draft_s(w) for w in self.step_widths)
        return time.perf_counter() - self._t0

    def step_time(self, nodes: int, extra_draft_s: float = 0.0) -> float:
        """Predicted time of a step verifying ``nodes`` draft nodes (root added)."""
        c = self.costs
        return self.drafted_s() + extra_draft_s + c.verify_s(nodes + 1) + c.other_s

    # --- tree growth -----------------------------------------------------------------------

    def worth_layer(self, tree: DraftTree, frontier: list[int], k: int, budget: int, match_len: int) -> bool:
        """Do the expected tokens of expanding ``frontier`` pay for its draft forward and the
        extra verification? Children are unknown yet: each frontier node is expected to yield an
        accepted child with the calibrated probability ``continues``, and so on down.

        The check looks up to ``LOOKAHEAD`` layers ahead (within the depth limit), assuming each
        later layer is as wide as this one: verification cost is not concave (on a CPU in
        float32 the second token of a block costs as much as the first, the next six almost
        nothing), so a layer that does not pay alone can open a path that does."""
        probs = self.acceptance.node_probs(tree, match_len)
        expected = sum(probs[1:])
        n = tree.num_draft
        c = self.acceptance.continues.mean
        mass, width = sum(probs[f] for f in frontier), len(frontier)
        new = k * width
        added = max(min(new, budget - n), 0)
        displaced = sum(sorted(probs[1:])[: max(new - added, 0)])
        now = (expected + 1.0) / self.step_time(n)
        depth = max(tree.depths[f] for f in frontier)
        gain, nodes, draft_s = -displaced, n, 0.0
        for i in range(1, min(self.cfg.max_depth - depth, LOOKAHEAD) + 1):
            grow = added if i == 1 else max(min(new, budget - nodes), 0)
            if i > 1 and grow == 0:
                break
            gain += mass * c**i
            nodes += grow
            draft_s += self.costs.draft_s(width)
            if (expected + gain + 1.0) / self.step_time(nodes, draft_s) > now:
                return True
        return False

    def best_prefix(self, tree: DraftTree, match_len: int) -> BestPrefix:
        """The nodes by acceptance probability (parents first) and how many of them maximise
        (expected accepted + 1) / step time. A node stays only if its expected acceptance pays
        for what it adds to the verification on this host."""
        probs = self.acceptance.node_probs(tree, match_len)
        order = sorted(range(1, len(tree)), key=lambda n: (-probs[n], n))  # parents first
        best = BestPrefix(order, 0, 0.0, 1.0 / self.step_time(0))
        expected = 0.0
        for i, node in enumerate(order, 1):
            expected += probs[node]
            rate = (expected + 1.0) / self.step_time(i)
            if rate > best.rate:
                best = BestPrefix(order, i, expected, rate)
        return best

    def trim(self, tree: DraftTree, match_len: int) -> tuple[DraftTree, int]:
        """Keep the nodes that maximise (expected accepted + 1) / step time, best first.
        Returns the tree and how many nodes were cut."""
        best = self.best_prefix(tree, match_len)
        cut = tree.num_draft - best.nodes
        if cut <= 0:
            return tree, 0
        trimmed = prune(tree, set(best.order[: best.nodes]))
        trimmed.stop = tree.stop
        return trimmed, cut

    # --- the draft model on or off ---------------------------------------------------------

    def model_decision(self, shared: DraftTree, match_len: int, pending: int, engaged: bool,
                       alone: DraftTree | None = None) -> str:
        """"" to run the draft model this step, else why not. ``shared`` holds the retrieval graft
        the model's tree would start from (its share of the budget, or only the root); ``alone``
        the graft retrieval sends when the model does not run (the full budget; ``shared`` when
        not given), as the trim would cut it; ``pending`` committed tokens the model has not seen."""
        best = self.best_prefix(alone if alone is not None else shared, match_len)
        n, alone_tokens, alone_rate = best.nodes, best.expected, best.rate
        shared_tokens = sum(self.acceptance.node_probs(shared, match_len)[1:])
        o = self.outlook
        catch_up = self.costs.prefill_s(pending) if pending > 1 else 0.0
        with_tokens = shared_tokens + o.accepted
        with_model = (with_tokens + 1.0) / self.step_time(
            shared.num_draft + o.nodes, o.draft_s + (catch_up if engaged else 0.0))
        if not engaged:
            long_prefill = catch_up > LONG_PREFILL_STEPS * self.costs.verify_s(1)
            if long_prefill and self.steps_without_model < WATCH_STEPS:
                return (f"draft model not engaged yet: its {pending}-token prefill ({catch_up:.2f} s) waits "
                        f"until retrieval alone has run {WATCH_STEPS} steps ({self.steps_without_model} so far)")
            without = o.goodput_without or alone_rate
            saved = self.remaining / without - self.remaining / max(with_model, 1e-9)
            if saved <= ENGAGE_MARGIN * catch_up:
                return (f"draft model not engaged: its {pending}-token prefill ({catch_up:.2f} s) would "
                        f"not pay back over the {self.remaining} tokens left ({saved:.2f} s saved)")
            return ""
        explored = self.model_steps >= EXPLORE_MODEL_STEPS  # the prior alone never skips it
        if explored and alone_rate >= with_model and self.skips_in_a_row < MAX_SKIPS_IN_A_ROW:
            if n:
                return (f"retrieval first: {n} retrieved nodes, {alone_tokens:.1f} expected -> {alone_rate:.1f} "
                        f"tok/s expected alone vs {with_model:.1f} with the draft model")
            return (f"plain step: no retrieval guess pays, and the draft model is expected to give "
                    f"{with_model:.1f} tok/s against {alone_rate:.1f} without it")
        return ""

    def record_step(self, tree: DraftTree, accepted: list[int], new_tokens: int,
                    model_ran: bool, model_draft_s: float, step_s: float) -> None:
        """Learn from the finished step: the running outlook of model steps (the acceptance
        model learns as the drafter commits). ``model_draft_s`` is the model's drafting time with
        its catch-up left out (the root forward charged at width 1): ``model_decision`` adds the
        catch-up of the step at hand."""
        self.remaining = max(self.remaining - new_tokens, 0)
        o = self.outlook
        if model_ran:
            self.skips_in_a_row = 0
            self.model_steps += 1
            model_accepted = sum(1 for n in accepted[1:] if tree.sources[n] == "model")  # beyond retrieval
            o.accepted += EMA * (model_accepted - o.accepted)
            o.draft_s += EMA * (model_draft_s - o.draft_s)
            o.nodes += EMA * (sum(1 for s in tree.sources if s in ("model", "both")) - o.nodes)
        else:
            self.skips_in_a_row += 1
            self.steps_without_model += 1
            rate = new_tokens / max(step_s, 1e-6)
            before = o.goodput_without
            o.goodput_without = rate if before is None else before + EMA * (rate - before)
