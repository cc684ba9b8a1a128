"""An online suffix automaton over token ids (SAM-Decoding's datastore): after every appended
token it knows, in O(1) amortised, the longest suffix of the context that also ends earlier, and
the positions it ended at. Complexity notes: ``talon.drafters.retrieval``."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

SEPARATOR = -1  # ends every corpus document; never a real token id, so never matched
DEFAULT_MAX_OCCURRENCES = 8
DEFAULT_PROPAGATE_DEPTH = 4
DEFAULT_CORPUS_MAX_TOKENS = 200_000
JSONL_SUFFIXES = (".jsonl", ".ndjson")
JSONL_FIELDS = ("turns", "text", "prompt")



@dataclass(frozen=True)
class SuffixMatch:
    """The longest matching suffix: its length and the end positions (index of the last token)
    of its earlier occurrences, most recent first (at most K; possibly not all of them)."""

    length: int
    ends: tuple[int, ...]


# ----------------------------------------------------------------------------- automaton


class SuffixIndex:
    """Online suffix automaton over a growing token stream.

    State 0 is the root (the empty string). Per state: ``len`` (longest string), ``link``
    (suffix link), ``next`` (dict transitions) and ``ends``, the latest known end positions
    (at most K + 1, oldest first). ``ends`` only ever holds real end positions of the state: a
    new state gets its own position, a clone copies its original's, and a new position p is
    recorded on the match state ``link[last]`` and on up to ``propagate_depth`` of its
    suffix-link ancestors (every state on that chain has p in its end set). Recording on the
    whole chain would make the lists exact but costs O(chain length), which is not amortisable
    (think "aaaa..."), so a short state whose occurrences were mostly inside longer matches may
    miss some; on random streams depth 4 already finds the latest occurrence > 99% of the time.
    A frozen (static) index recomputes exact lists: the K + 1 latest end positions per state.

    ``extend`` costs amortised O(1) per token: the SAM walks (suffix links, redirected and
    copied transitions; < ~6n in total, the standard analysis) plus O(propagate_depth) for the
    end positions. ``work`` counts all of those steps.
    """

    def __init__(
        self,
        max_occurrences: int = DEFAULT_MAX_OCCURRENCES,
        propagate_depth: int = DEFAULT_PROPAGATE_DEPTH,
    ) -> None:
        if max_occurrences < 1 or propagate_depth < 0:
            raise ValueError(
                f"need max_occurrences >= 1 and propagate_depth >= 0, "
                f"got {max_occurrences} and {propagate_depth}"
            )
        self.max_occurrences = max_occurrences
        self.propagate_depth = propagate_depth
        self.tokens: list[int] = []
        self.work = 0
        self._len: list[int] = [0]
        self._link: list[int] = [-1]
        self._next: list[dict[int, int]] = [{}]
        self._ends: list[list[int]] = [[]]
        self._own: list[int] = [-1]  # creation position of non-clone states, -1 for clones
        self._last = 0
        self._frozen = False

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_states(self) -> int:
        return len(self._len)

    def extend(self, tokens: Iterable[int]) -> None:
        if self._frozen:
            raise RuntimeError("this SuffixIndex is frozen (static); build a new one to extend it")
        for token in tokens:
            self._append(int(token))

    def _append(self, token: int) -> None:
        pos = len(self.tokens)
        self.tokens.append(token)
        cur = self._new_state(self._len[self._last] + 1, [pos], own=pos)
        p = self._last
        self.work += 1
        while p != -1 and token not in self._next[p]:
            self._next[p][token] = cur
            p = self._link[p]
            self.work += 1
        if p == -1:
            self._link[cur] = 0
        else:
            self._link[cur] = self._attach(p, token, pos)
        self._last = cur

    def _attach(self, p: int, token: int, pos: int) -> int:
        """The suffix link of the new state: ``next[p][token]``, cloned if it is too long."""
        q = self._next[p][token]
        if self._len[p] + 1 == self._len[q]:
            self._record_end(q, pos)
            return q
        clone = self._new_state(self._len[p] + 1, list(self._ends[q]), own=-1)
        self._next[clone] = dict(self._next[q])
        self._link[clone] = self._link[q]
        self.work += len(self._next[q])
        while p != -1 and self._next[p].get(token) == q:
            self._next[p][token] = clone
            p = self._link[p]
            self.work += 1
        self._link[q] = clone
        self._record_end(clone, pos)
        return clone

    def _new_state(self, length: int, ends: list[int], own: int) -> int:
        self._len.append(length)
        self._link.append(-1)
        self._next.append({})
        self._ends.append(ends)
        self._own.append(own)
        return len(self._len) - 1

    def _record_end(self, state: int, pos: int) -> None:
        """Record ``pos`` on the match state and up to ``propagate_depth`` of its ancestors."""
        for _ in range(self.propagate_depth + 1):
            if state <= 0:
                return
            ends = self._ends[state]
            ends.append(pos)
            if len(ends) > self.max_occurrences + 1:
                del ends[0]  # O(K), K small: cheaper in memory than a deque per state
            state = self._link[state]
            self.work += 1

    def longest_match(self) -> SuffixMatch:
        """The longest suffix that also ends earlier, with those earlier end positions. O(K)."""
        if self._last == 0:
            return SuffixMatch(0, ())
        state = self._link[self._last]
        return SuffixMatch(self._len[state], self.ends_before(state, len(self.tokens) - 1))

    def ends_before(self, state: int, limit: int) -> tuple[int, ...]:
        """Recorded end positions of ``state`` below ``limit``, most recent first, at most K."""
        if state == 0:
            return ()
        ends = [e for e in reversed(self._ends[state]) if e < limit]
        return tuple(ends[: self.max_occurrences])

    def advance(self, state: int, length: int, token: int) -> tuple[int, int]:
        """Streaming matcher step (read-only): from the state of the longest suffix of some
        external text that occurs here, with its length, to the same after appending ``token``.
        Amortised O(1): ``length`` grows by at most one per call and every link step shrinks it."""
        while state != 0 and token not in self._next[state]:
            state = self._link[state]
            length = self._len[state]
        nxt = self._next[state].get(token)
        if nxt is None:
            return 0, 0
        return nxt, length + 1

    def continuation(self, end: int, max_len: int) -> list[int]:
        """Tokens after position ``end``: at most ``max_len``, stopping at a document separator."""
        out: list[int] = []
        for token in self.tokens[end + 1 : end + 1 + max_len]:
            if token < 0:
                break
            out.append(token)
        return out

    def freeze(self) -> None:
        """Make the index static and its end-position lists exact (K + 1 latest per state).

        One pass over the suffix-link tree, children before parents: O(states * K)."""
        cap = self.max_occurrences + 1
        exact: list[list[int]] = [[p] if p >= 0 else [] for p in self._own]
        for state in sorted(range(1, self.num_states), key=self._len.__getitem__, reverse=True):
            exact[state] = sorted(exact[state])[-cap:]
            parent = self._link[state]
            if parent > 0:
                exact[parent].extend(exact[state])
        exact[0] = []
        self._ends = exact
        self._frozen = True
