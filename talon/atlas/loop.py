"""Exact replay: the real decode loop (``talon.engine.run.Run``) with the draft model answered from an
atlas and verification by matching the target's greedy text. No model is loaded.

* :class:`AtlasModel` is a ``DraftSource`` (``talon.core.contracts``), standing in for
  :class:`~talon.drafters.model.ModelSource` inside the real
  :class:`~talon.drafters.tree_drafter.TreeDrafter`: the same ``reset`` / ``expand`` / ``commit``
  bookkeeping (which tokens a forward feeds, when the prompt prefill is paid), children read from
  the atlas. A request the atlas cannot answer (deeper, wider, beyond its superset) is counted,
  never treated as a rejection: the replay reports its coverage.
* :class:`TextVerifier`, a ``Verifier``: the target's argmax after a node is the next token of the greedy text
  wherever the node's path follows the text (unknown, -1, elsewhere), which is all greedy
  acceptance needs: the accepted path is the longest that follows the text, plus the bonus.
* The real retriever reads the known text; cost-aware planning runs on the atlas's
  fixed cost model, and every step's times are that model's predictions.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from talon.atlas.data import QUANTIZED_DRAFT, Atlas
from talon.atlas.result import Coverage, check_replayable
from talon.core.accept import accept_greedy
from talon.core.contracts import Verdict
from talon.cost.model import CostModel
from talon.drafters.model import DraftLedger
from talon.drafters.retrieval import Retriever
from talon.drafters.tree_drafter import build_drafter
from talon.engine.prompt import StopCheck
from talon.engine.run import Run, RunParts
from talon.run_config import RunConfig
from talon.trace import RunModels, StepTrace
from talon.tree import DraftTree


class AtlasModel(DraftLedger):
    """The draft model's part of the hybrid drafter, read from an atlas (the same bookkeeping as
    ``ModelSource``: committed context, what the next root forward must feed, per-forward widths)."""

    def __init__(self, atlas: Atlas, costs: CostModel, coverage: Coverage) -> None:
        self.atlas = atlas
        self.costs = costs
        self.coverage = coverage
        self.prompt_len = len(atlas.prompt_ids)
        self.context: list[int] = []
        self.fed = 0
        self.slots: set[tuple[int, ...]] = set()  # paths expanded this step (ModelSource's cache slots)
        self.timings: list[tuple[int, float]] = []

    def reset(self, prompt_ids: list[int], prefill: bool = True) -> None:
        self.context = list(prompt_ids)
        self.fed = len(prompt_ids) - 1 if prefill and len(prompt_ids) > 1 else 0
        self.slots, self.timings = set(), []

    def expand(self, tree: DraftTree, nodes: list[int], k: int) -> list[list[tuple[int, float]]]:
        p = len(self.context) - self.prompt_len
        if nodes == [0]:
            width = max(self.pending, 1)
            self.fed = len(self.context)
        else:
            width = len(nodes)
        out = []
        for node in nodes:
            path = tuple(tree.tokens[n] for n in tree.path(node)[1:])
            self.slots.add(path)
            kids = self.atlas.lookup(p, path, k)
            self.coverage.requests += 1
            if kids is None:
                self.coverage.misses += 1
                self.coverage.missing.add(self.atlas.canonical(p, path))
                if not self.coverage.first_miss:
                    self.coverage.first_miss = (f"at token {p}, depth {len(path)}: {k} children asked, "
                                                f"the atlas holds {self._held(p, path)}")
                kids = []
            out.append(kids)
        self.timings.append((width, self.costs.draft_s(width)))
        return out

    def _held(self, p: int, path: tuple[int, ...]) -> str:
        kids = self.atlas.children.get(self.atlas.canonical(p, path))
        return "no entry for this node (outside the recorded superset)" if kids is None else f"{len(kids)}"

    def commit(self, tree: DraftTree, accepted: list[int], new_tokens: list[int]) -> None:
        kept = 0
        # a head feeds its accepted tokens again, with their features (talon.drafters.eagle3): none kept
        for node in accepted[1:] if not self.atlas.reads_features else ():
            if tuple(tree.tokens[n] for n in tree.path(node)[1:]) not in self.slots:
                break
            kept += 1
        if self.slots:
            self.fed += kept
        self.slots = set()
        self.context.extend(new_tokens)


class TextVerifier:
    """Greedy verification against the target's recorded text."""

    def __init__(self, atlas: Atlas) -> None:
        self.output = atlas.output
        self.prompt_len = len(atlas.prompt_ids)
        self.p = 0  # generated tokens committed

    def prefill(self, ids: list[int]) -> None:
        self.p = 0

    def verify(self, tree: DraftTree) -> Verdict:
        out, p = self.output, self.p
        follows = [True]  # does the node's path follow the text?
        top1 = [out[p] if p < len(out) else -1]
        for n in range(1, len(tree)):
            at = p + tree.depths[n] - 1
            ok = follows[tree.parents[n]] and at < len(out) and tree.tokens[n] == out[at]
            follows.append(ok)
            top1.append(out[at + 1] if ok and at + 1 < len(out) else -1)
        positions = [self.prompt_len - 1 + p + d for d in tree.depths]
        return Verdict(top1, accept_greedy(tree, top1), ([], []), positions)

    def commit(self, verdict: Verdict) -> None:
        self.p += len(verdict.acceptance.accepted)

    def close(self) -> None:
        """Nothing held."""


def replay_run(atlas: Atlas, cfg: RunConfig, cancel: threading.Event | None = None) -> tuple[Run, Coverage]:
    """A ``Run`` of ``cfg`` over ``atlas`` (iterate it for steps), and its coverage record."""
    check_replayable(atlas, cfg)
    cfg = cfg.replace(async_draft=False, cost_model="fixed")
    costs = atlas.cost_model()
    coverage = Coverage()
    drafter = build_drafter(cfg, AtlasModel(atlas, costs, coverage), Retriever(cfg.retrieval))
    limit = min(cfg.max_new_tokens, len(atlas.output))
    models = atlas.models
    parts = RunParts(
        prompt_ids=list(atlas.prompt_ids),
        prompt_text=atlas.prompt,
        drafter=drafter,
        verifier=TextVerifier(atlas),
        stop=StopCheck(None, set(atlas.eos), (), limit),  # no stop strings: no tokenizer needed
        token_text=atlas.text,
        detokenize=atlas.detokenize,
        models=RunModels(target=str(models.get("target", "")), draft=str(models.get("draft", "")),
                         dtype=str(models.get("dtype", "")), device="atlas replay"),
        costs=costs.copy() if cfg.tree.cost_aware and cfg.drafts else None,
        predicted_times=costs,
    )
    return Run(cfg, parts, cancel), coverage


@dataclass(frozen=True)
class Agreement:
    """How a replay compares with a real run of the same configuration."""

    equal: bool  # every step accepted as many tokens, and the text is the same
    step: int | None = None  # the first step that differs
    near_tie: bool = False  # that difference is a floating-point near-tie of the draft's q
    reason: str = ""
    outside: bool = False  # the replay asked the atlas for nodes it does not hold (see its coverage)
    quantized: bool = False  # the draft's q depends on its batch (an int8 draft): the atlas is approximate


def _nodes(step: StepTrace) -> dict[tuple[int, ...], tuple[float, float]]:
    """path -> (q, path confidence) of every drafted node of a step's tree."""
    paths: list[tuple[int, ...]] = [()]
    for n in range(1, len(step.tokens)):
        paths.append(paths[step.parents[n]] + (step.tokens[n],))
    return {paths[n]: (step.q_draft[n], step.path_conf[n]) for n in range(1, len(step.tokens))}


def compare_runs(real: list[StepTrace], replayed: list[StepTrace], tol: float = 1e-4,
                 coverage: Coverage | None = None, quantized: bool = False) -> Agreement:
    """Compare a replay with the real run step by step. Where they part, name why: the replay
    asked for nodes outside the atlas (``coverage``), or the draft's q in the real run and in the
    atlas differ (batched forwards round differently) and a decision (gate, rank, top-k order)
    rests on a gap no larger than that: a near-tie; or (``quantized``: ``Atlas.batch_dependent``)
    the draft's q depends on which rows share its forward, so the atlas only approximates it."""
    for i, (a, b) in enumerate(zip(real, replayed)):
        if a.new_tokens == b.new_tokens and a.tokens == b.tokens and a.parents == b.parents:
            continue
        real_nodes, replay_nodes = _nodes(a), _nodes(b)
        shared = real_nodes.keys() & replay_nodes.keys()
        drift = max((abs(real_nodes[p][0] - replay_nodes[p][0]) for p in shared), default=0.0)
        apart = (real_nodes.keys() | replay_nodes.keys()) - shared
        confs = sorted({v[1] for v in real_nodes.values()} | {v[1] for v in replay_nodes.values()}
                       | {g for g in a.gate_threshold + b.gate_threshold if g is not None})
        gap = min((abs(x - y) for x, y in zip(confs, confs[1:])), default=1.0)
        same_verdict = a.new_tokens == b.new_tokens
        near = bool(apart) and gap <= max(10 * drift, tol * 1e-2)
        what = (f"step {i}: trees differ in {len(apart)} node(s); draft q drifts by at most {drift:.1e} between "
                f"the real run and the atlas, and the closest competing path confidences are {gap:.1e} apart")
        if same_verdict and len(real) == len(replayed):
            continue  # the trees differ, the verdicts agree: keep comparing
        if coverage is not None and coverage.misses:
            return Agreement(False, i, False, f"{what}; the replay asked for nodes outside the atlas "
                             f"({coverage.misses} of {coverage.requests}: {coverage.first_miss})", outside=True)
        if quantized:
            return Agreement(False, i, near, f"{what}; {QUANTIZED_DRAFT}", quantized=True)
        return Agreement(False, i, near, what + (" (a near-tie)" if near else ""))
    if [s.new_tokens for s in real] != [s.new_tokens for s in replayed]:
        return Agreement(False, min(len(real), len(replayed)), False, "the runs have different lengths")
    return Agreement(True)
