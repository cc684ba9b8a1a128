"""Adaptive draft length: the rules engines and libraries use to choose how many tokens to draft
each step, replayed on atlases with no model, beside TALON's confidence gate and a fixed chain.

Every rule here drafts the draft's greedy chain (one token a forward, the top child of each node)
and differs only in how long the chain may grow; each rule is read from its source at a pinned
version (cited in its docstring):

* :class:`FixedChain` (``fixed``): ``k`` tokens every step (vLLM ``draft_model``, SGLang with topk 1).
* ``talon.atlas.adaptive_hf.HfAssisted`` (``hf-heuristic``, ``hf-heuristic-transient``,
  ``hf-confidence``): transformers' assisted generation, its ``num_assistant_tokens_schedule`` and
  its dynamic ``assistant_confidence_threshold``.
* :class:`SglangAdaptive` (``sglang-adaptive``): SGLang's ``--speculative-adaptive`` steps.
* :class:`VllmDynamicK` (``vllm-dsd``): vLLM's ``num_speculative_tokens_per_batch_size``.
* :class:`LlamaCppStreak` (``llamacpp-streak``): nothing merged in llama.cpp at the pinned version
  adapts the length; this is the open proposal ggml-org/llama.cpp#25726, marked unmerged.

The loop (:func:`replay_lengths`) is one request's, greedy: a step drafts the chain from the ``p``
tokens generated so far, at most the rule's length and the request's room (``limit - p - 1``, as
transformers and llama-server cap it; vLLM and SGLang draft their full length and cut the output,
which differs only on a request's last step); the target keeps the longest prefix that follows
the text plus its own next token, cut at the limit and after an end-of-sequence token; the rule
then learns from the step. Rules that carry state from request to request (transformers'
``heuristic``, SGLang's controller) replay a sequence of atlases in order (:func:`replay_requests`).
Each step also records the **oracle**: how many tokens of the draft's own chain, however long,
the target would have accepted (known from the atlas's on-text nodes). Time is predicted on the
atlas's cost curves: one draft forward at width 1 a drafted token, a target forward over the draft
plus its root, and the step's bookkeeping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from talon.atlas.budget import checkpoint
from talon.atlas.data import Atlas
from talon.atlas.serving import LLAMACPP_VERSION
from talon.atlas.serving_replay import NEAR_TIE, check_int, could_swap
from talon.cost.model import CostModel
from talon.run_config import ConfigError

SGLANG_ADAPTIVE_VERSION = ("SGLang d9dddd4d7 (#23336; #21599 b65799cf8): speculative/adaptive_spec_params.py, "
                           "the batch-size-1 slot of later versions")
VLLM_DSD_VERSION = "vLLM 0.33.0 (4ba787ec9): vllm/v1/spec_decode/dynamic/utils.py, core/sched/scheduler.py"
LLAMACPP_STREAK_SOURCE = f"ggml-org/llama.cpp#25726 (open, unmerged at {LLAMACPP_VERSION})"
ORACLE_DEPTH = 64  # the deepest oracle counted: the longest chain an atlas records


@dataclass
class LengthStep:
    """One verify step under a length rule (the bonus token not counted in ``accepted``)."""

    p: int  # generated tokens committed before the step
    allowed: int  # the rule's length this step, before the room and the chain's own stops
    drafted: int
    accepted: int
    oracle: int  # the draft's own chain's tokens the target would accept from p
    missing: str = ""
    near_tie: str = ""

    @property
    def new_tokens(self) -> int:
        return self.accepted + 1


@dataclass
class LengthRun:
    """One request replayed under one rule."""

    rule: str
    steps: list[LengthStep]
    tokens: int  # tokens generated (the prefill's first token included, where the rule has one)
    predicted_s: float = 0.0

    @property
    def drafted(self) -> int:
        return sum(s.drafted for s in self.steps)

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.steps)

    @property
    def mat(self) -> float:
        """Tokens a verify step, as Talon's run summary counts them (every generated token, the
        prefill's first one included, over the verify steps)."""
        return self.tokens / len(self.steps) if self.steps else 0.0

    @property
    def misses(self) -> int:
        return sum(1 for s in self.steps if s.missing)

    @property
    def near_ties(self) -> list[str]:
        return [s.near_tie for s in self.steps if s.near_tie]


class LengthRule:
    """What every rule shares: a name, its knobs, a length each step and what it learns."""

    name = ""
    drafts_first_token = False  # transformers drafts before the target's first token (no separate prefill step)

    def knobs(self) -> dict[str, Any]:
        return {}

    def label(self) -> str:
        knobs = ", ".join(f"{k}={v}" for k, v in self.knobs().items())
        return f"{self.name} ({knobs})" if knobs else self.name

    def start(self) -> None:
        """A request begins."""

    def length(self) -> int:
        raise NotImplementedError

    def stop_after(self, q: float) -> bool:
        """Whether the chain stops after a drafted token of probability ``q`` (it is kept)."""
        return False

    def threshold(self) -> float | None:
        """The confidence the chain's stop compares with (None: no such stop)."""
        return None

    def learn(self, drafted: int, accepted: int, probs: list[float]) -> None:
        """The step is verified: ``probs`` are the drafted tokens' q."""

    def finish(self) -> None:
        """The request ends."""


@dataclass
class FixedChain(LengthRule):
    """``k`` tokens every step: vLLM ``{"method": "draft_model", "num_speculative_tokens": k}``,
    SGLang with topk 1 and ``--speculative-num-steps k``."""

    k: int = 4
    name = "fixed"

    def __post_init__(self) -> None:
        check_int("k", self.k, 1, ORACLE_DEPTH)

    def knobs(self) -> dict[str, Any]:
        return {"k": self.k}

    def length(self) -> int:
        return self.k


@dataclass
class SglangAdaptive(LengthRule):
    """SGLang ``--speculative-adaptive`` (``SGLANG_ADAPTIVE_VERSION``; EAGLE/EAGLE3 with topk 1 in
    SGLang, replayed here on whichever chain the atlas drafts). One controller for the server,
    never reset between requests: after every verify step, the EMA of accepted drafts (bonus not
    counted; the batch's mean, here one request) moves by ``ema_alpha``; past ``warmup_batches``,
    every ``update_interval``-th step it steps down the candidates while ``ema <= lower - 0.5 +
    down_hysteresis`` and up while ``ema > current - 0.5 + up_hysteresis``. The EMA starts at the
    starting steps minus one; it starts at the middle candidate (``start`` 0), or at ``start``. The
    switch applies from the next step (the non-overlap scheduler). Defaults: candidates 1, 3, 7,
    alpha 0.2, warmup 10, interval 5, down −0.25, up 0."""

    candidate_steps: tuple[int, ...] = (1, 3, 7)
    ema_alpha: float = 0.2
    warmup_batches: int = 10
    update_interval: int = 5
    down_hysteresis: float = -0.25
    up_hysteresis: float = 0.0
    start_steps: int = 0
    name = "sglang-adaptive"
    steps: int = field(init=False, default=0)
    ema: float = field(init=False, default=0.0)
    batches: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        cands = tuple(sorted(set(self.candidate_steps)))
        if len(cands) < 2 or cands[0] < 1 or cands[-1] > ORACLE_DEPTH:
            raise ConfigError(f"candidate_steps must hold at least two step counts in [1, {ORACLE_DEPTH}], "
                              f"got {self.candidate_steps!r}")
        self.candidate_steps = cands
        if not 0 < self.ema_alpha <= 1:
            raise ConfigError(f"ema_alpha must be in (0, 1], got {self.ema_alpha!r}")
        check_int("warmup_batches", self.warmup_batches, 0, 1 << 20)
        check_int("update_interval", self.update_interval, 1, 1 << 20)
        if self.start_steps and self.start_steps not in cands:
            raise ConfigError(f"start_steps must be one of the candidates {cands}, got {self.start_steps!r}")
        self.steps = self.start_steps or cands[(len(cands) - 1) // 2]
        self.ema, self.batches = float(self.steps - 1), 0

    def knobs(self) -> dict[str, Any]:
        return {"candidate_steps": ":".join(map(str, self.candidate_steps)), "ema_alpha": self.ema_alpha,
                "warmup_batches": self.warmup_batches, "update_interval": self.update_interval,
                "down_hysteresis": self.down_hysteresis, "up_hysteresis": self.up_hysteresis}

    def length(self) -> int:
        return self.steps

    def learn(self, drafted: int, accepted: int, probs: list[float]) -> None:
        self.ema = (1 - self.ema_alpha) * self.ema + self.ema_alpha * accepted
        self.batches += 1
        if self.batches <= self.warmup_batches or (self.batches - self.warmup_batches) % self.update_interval:
            return
        cands = self.candidate_steps
        i = cands.index(self.steps)
        while i > 0 and self.ema <= cands[i - 1] - 0.5 + self.down_hysteresis:
            i -= 1
        while i < len(cands) - 1 and self.ema > cands[i] - 0.5 + self.up_hysteresis:
            i += 1
        self.steps = cands[i]


@dataclass
class VllmDynamicK(LengthRule):
    """vLLM's dynamic speculative decoding (``VLLM_DSD_VERSION``): ``num_speculative_tokens_per_batch_size``,
    ranges ``start-end:K`` that must begin at 1 and may not overlap; a batch size in a gap or past
    the last range takes the previous range's K, clamped to ``num_speculative_tokens``. No acceptance
    feedback: K depends on the batch size alone, so at one ``batch_size`` it is a fixed chain. The
    default table is an example, not vLLM's (vLLM has none: the feature is off unless given one)."""

    k: int = 3
    table: tuple[tuple[int, int, int], ...] = ((1, 16, 3), (17, 64, 2), (65, 4096, 0))
    batch_size: int = 1
    name = "vllm-dsd"

    def __post_init__(self) -> None:
        check_int("k", self.k, 1, ORACLE_DEPTH)
        check_int("batch_size", self.batch_size, 1, 1 << 16)
        ranges = sorted(self.table)
        if not ranges or ranges[0][0] != 1 or any(s < 1 or e < s or k < 0 for s, e, k in ranges) \
                or any(b[0] <= a[1] for a, b in zip(ranges, ranges[1:])):
            raise ConfigError("the batch-size table's ranges start-end:K must begin at 1, with start <= end, "
                              f"K >= 0 and no overlap; got {self.table!r}")
        self.table = tuple(ranges)

    def knobs(self) -> dict[str, Any]:
        return {"k": self.k, "table": ",".join(f"{s}-{e}:{k}" for s, e, k in self.table),
                "batch_size": self.batch_size}

    def length(self) -> int:
        return min(self.k, [k for s, _, k in self.table if s <= self.batch_size][-1])


@dataclass
class LlamaCppStreak(LengthRule):
    """The open proposal ggml-org/llama.cpp#25726 (``--spec-draft-adaptive-length-threshold N``,
    ``-bias B``), unmerged: after N successes in a row (a step that accepted at least its draft
    minus B) the length grows by one, after N failures in a row it shrinks by one, within
    ``[max(n_min, 1), n_max]``. The thread does not say where it starts: here at ``n_max``."""

    n_max: int = 16
    n_min: int = 1
    threshold_n: int = 11
    bias: int = 0
    name = "llamacpp-streak"
    current: int = field(init=False, default=0)
    run: int = field(init=False, default=0)  # > 0: successes in a row; < 0: failures

    def __post_init__(self) -> None:
        check_int("n_max", self.n_max, 1, ORACLE_DEPTH)
        check_int("n_min", self.n_min, 0, self.n_max)
        check_int("threshold_n", self.threshold_n, 1, 1 << 16)
        check_int("bias", self.bias, 0, ORACLE_DEPTH)
        self.current = self.n_max

    def knobs(self) -> dict[str, Any]:
        return {"n_max": self.n_max, "n_min": self.n_min, "threshold_n": self.threshold_n, "bias": self.bias}

    def length(self) -> int:
        return self.current

    def learn(self, drafted: int, accepted: int, probs: list[float]) -> None:
        if not drafted:
            return
        success = accepted >= drafted - self.bias
        self.run = max(self.run, 0) + 1 if success else min(self.run, 0) - 1
        if self.run >= self.threshold_n:
            self.current, self.run = min(self.current + 1, self.n_max), 0
        elif -self.run >= self.threshold_n:
            self.current, self.run = max(self.current - 1, max(self.n_min, 1)), 0


# --- the loop ------------------------------------------------------------------------------------

def oracle(atlas: Atlas, p: int, depth: int = ORACLE_DEPTH) -> int:
    """How many tokens of the draft's own greedy chain from ``p`` follow the text."""
    m = 0
    while m < depth and p + m < len(atlas.output):
        kids = atlas.children.get((p + m, ()))
        if not kids or kids[0][0] != atlas.output[p + m]:
            break
        m += 1
    return m


def draft_chain(atlas: Atlas, p: int, cap: int, rule: LengthRule,
                eos: set[int]) -> tuple[list[int], list[float], str, str]:
    """The chain from ``p``: (tokens, their q, missing, near-tie), at most ``cap`` tokens, stopped
    where ``rule`` stops it (a stopped token is kept) and, for transformers, after an EOS. Off the
    text, a rule with no confidence stop drafts on blind (-1 tokens: they are rejected anyway)."""
    tokens: list[int] = []
    probs: list[float] = []
    near = ""
    path: tuple[int, ...] = ()
    threshold = rule.threshold()
    while len(tokens) < cap:
        if threshold is None and path and atlas.off_text(p, path):
            tokens += [-1] * (cap - len(tokens))
            break
        kids = atlas.children.get(atlas.canonical(p, path))
        if not kids:
            return tokens, probs, f"at token {p}, depth {len(path)}: the draft's chain is not in the atlas", near
        token, q = kids[0]
        if not near and len(kids) > 1 and could_swap(kids[0][1], kids[1][1]):
            near = (f"at token {p}, depth {len(path) + 1}: the draft's top two q are "
                    f"{kids[0][1]:.6f} and {kids[1][1]:.6f}")
        if not near and threshold is not None and abs(q - threshold) <= NEAR_TIE * threshold:
            near = f"at token {p}, depth {len(path) + 1}: q {q:.6f} against the threshold {threshold:.6f}"
        tokens.append(token)
        probs.append(q)
        path += (token,)
        if rule.stop_after(q) or (rule.drafts_first_token and token in eos):
            break
    return tokens, probs, "", near


def replay_lengths(atlas: Atlas, rule: LengthRule, limit: int | None = None,
                   costs: CostModel | None = None) -> LengthRun:
    """One request of ``atlas`` under ``rule`` (its state carried in from earlier requests):
    ``limit`` new tokens at most, the request's ``max_new_tokens`` that caps its drafts (None: the
    recorded text's length; more than it only where the text ended on an end-of-sequence token)."""
    output, eos = atlas.output, set(atlas.eos)
    ended = bool(output) and output[-1] in eos
    limit = len(output) if limit is None or (limit > len(output) and not ended) else limit
    costs = costs if costs is not None else (atlas.cost_model() if atlas.costs else None)
    rule.start()
    steps: list[LengthStep] = []
    p = 0 if rule.drafts_first_token else 1  # engines sample the first token in the prefill
    seconds = 0.0
    done = limit <= p or (p == 1 and output[0] in eos)
    while not done:
        checkpoint()
        allowed = rule.length()
        cap = max(min(allowed, limit - p - 1), 0)
        tokens, probs, missing, near = draft_chain(atlas, p, cap, rule, eos) if cap else ([], [], "", "")
        matched = 0
        while matched < len(tokens) and p + matched < len(output) and tokens[matched] == output[p + matched]:
            matched += 1
        if matched == len(tokens) and tokens and p + matched >= len(output) and not missing:
            missing = f"at token {p}: the draft runs past the {len(output)} recorded tokens"
        new = min(matched + 1, limit - p)
        cut = next((i + 1 for i, t in enumerate(output[p:p + new]) if t in eos), new)
        accepted = cut - 1
        rule.learn(len(tokens), accepted, probs)
        steps.append(LengthStep(p, allowed, len(tokens), accepted, oracle(atlas, p), missing, near))
        if costs is not None:
            seconds += len(tokens) * costs.draft_s(1) + costs.verify_s(len(tokens) + 1) + costs.other_s
        p += cut
        done = p >= limit or cut < new or output[p - 1] in eos
    rule.finish()
    return LengthRun(rule.label(), steps, p, seconds)


def replay_requests(atlases: Sequence[Atlas], rule: LengthRule, limit: int | None = None) -> list[LengthRun]:
    """The atlases as one server's (or one assistant model's) requests in order, the rule's state
    carried from each to the next."""
    return [replay_lengths(atlas, rule, limit) for atlas in atlases]
