"""Retrieval drafter: continuations of the longest matching suffix, as a small frequency trie.

The context (prompt + generated tokens) lives in a :class:`SuffixIndex`, an online suffix
automaton over token ids (SAM-Decoding's datastore). After every appended token the automaton
knows, in O(1), the *match*: the longest suffix of the context that also ends at an earlier
position. The tokens that followed those earlier occurrences are the draft: up to
``max_occurrences`` of them (most recent first) are merged into a trie whose node confidence is
the continuation frequency, ``q(child) = count(child) / count(parent continuing)``.

An optional static :class:`CorpusIndex` (a suffix automaton over a jsonl/text datastore, built
once) is matched against the context with the classic streaming matcher, also O(1) amortised
per context token. :meth:`RetrievalDrafter.propose` drafts from whichever source has the longer
match (ties: the context wins).

Complexity, n = context length, K = ``max_occurrences``, D = ``cfg.max_continuation``:

* ``extend``: amortised O(1) per token: the suffix-automaton construction walks (transitions
  are dicts, so the constant is a hash lookup) plus B + 1 bounded-list appends to record the new
  end position on the match state and B = ``propagate_depth`` of its suffix-link ancestors.
  :attr:`SuffixIndex.work` counts the elementary steps: below (6 + B + 1) * n; measured 2n-10n.
* ``propose``: O(K * D + max_nodes * log max_nodes), independent of n. Nothing ever rescans
  the context.
"""

from __future__ import annotations

import heapq
import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from talon.config import RetrievalConfig

logger = logging.getLogger(__name__)

SEPARATOR = -1  # ends every corpus document; never a real token id, so never matched
DEFAULT_MAX_OCCURRENCES = 8
DEFAULT_PROPAGATE_DEPTH = 4
DEFAULT_CORPUS_MAX_TOKENS = 200_000
JSONL_SUFFIXES = (".jsonl", ".ndjson")
JSONL_FIELDS = ("turns", "text", "prompt")


# ----------------------------------------------------------------------------- records


@dataclass
class RetrievalProposal:
    """A retrieval draft: a trie under the root (the last context token).

    ``tokens[i]`` is a drafted token, ``parents[i]`` the index of its parent in ``tokens`` (or
    -1: a child of the root), so parents always precede children. ``q[i]`` is the fraction of
    the parent's occurrences that continue with ``tokens[i]``. ``match_len`` is reported even
    when the proposal is empty (below ``min_match``), so the hybrid rule and the UI can show it.
    """

    match_len: int = 0
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    q: list[float] = field(default_factory=list)
    source: str = "none"  # "context" | "corpus" | "none"
    num_occurrences: int = 0  # earlier occurrences of the match the trie was built from

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> list[int]:
        """Depth of each node; the root's children have depth 1."""
        out: list[int] = []
        for parent in self.parents:
            out.append(1 if parent < 0 else out[parent] + 1)
        return out

    def path(self, node: int) -> list[int]:
        """Tokens from the root's child down to ``node``, both included."""
        out: list[int] = []
        while node >= 0:
            out.append(self.tokens[node])
            node = self.parents[node]
        return out[::-1]


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


# ----------------------------------------------------------------------------- trie


def _branch(
    members: list[int], depth: int, continuations: Sequence[Sequence[int]], max_branches: int
) -> list[tuple[int, float, list[int]]]:
    """Children of a trie node: (token, q, members), count desc then recency, at most
    ``max_branches``. ``members`` index ``continuations`` (most recent first) and all share the
    node's path; ``depth`` is the index of the child token in each continuation."""
    groups: dict[int, list[int]] = {}
    for member in members:
        cont = continuations[member]
        if len(cont) > depth:
            groups.setdefault(cont[depth], []).append(member)
    total = sum(len(g) for g in groups.values())
    ranked = sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))
    return [(token, len(g) / total, g) for token, g in ranked[:max_branches]]


def build_trie(
    continuations: Sequence[Sequence[int]], max_nodes: int, max_depth: int, max_branches: int
) -> tuple[list[int], list[int], list[float]]:
    """Merge continuations (most recent first) into a trie of at most ``max_nodes`` nodes.

    Nodes are admitted best-first by path confidence (product of q), so the trie is deep where
    the occurrences agree and wide where they do not; a child's path confidence never exceeds
    its parent's, so the admission order is a topological order. Returns (tokens, parents, q).
    """
    tokens: list[int] = []
    parents: list[int] = []
    q: list[float] = []
    roots = _branch(list(range(len(continuations))), 0, continuations, max_branches)
    # (-path_conf, tie-break, parent, token, q, depth, members)
    heap = [(-qc, i, -1, tok, qc, 1, members) for i, (tok, qc, members) in enumerate(roots)]
    heapq.heapify(heap)
    seq = len(heap)
    while heap and len(tokens) < max_nodes:
        neg_conf, _, parent, token, q_node, depth, members = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(token)
        parents.append(parent)
        q.append(q_node)
        if depth >= max_depth:
            continue
        for child, q_child, child_members in _branch(members, depth, continuations, max_branches):
            entry = (neg_conf * q_child, seq, node, child, q_child, depth + 1, child_members)
            heapq.heappush(heap, entry)
            seq += 1
    return tokens, parents, q


# ----------------------------------------------------------------------------- corpus


class CorpusIndex:
    """A static datastore: one frozen suffix automaton over documents joined by separators."""

    def __init__(
        self,
        documents: Iterable[Sequence[int]],
        max_tokens: int = DEFAULT_CORPUS_MAX_TOKENS,
        max_occurrences: int = DEFAULT_MAX_OCCURRENCES,
    ) -> None:
        self.index = SuffixIndex(max_occurrences)
        self.num_documents = 0
        budget = max_tokens
        for doc in documents:
            if budget <= 0:
                logger.info("corpus truncated at max_tokens=%d", max_tokens)
                break
            chunk = [int(t) for t in doc][:budget]
            if any(t < 0 for t in chunk):
                raise ValueError("corpus token ids must be >= 0")
            self.index.extend(chunk + [SEPARATOR])
            budget -= len(chunk)
            self.num_documents += 1
        self.index.freeze()

    @property
    def num_tokens(self) -> int:
        return len(self.index) - self.num_documents

    @staticmethod
    def from_file(
        path: str, tokenize: Callable[[str], list[int]], max_tokens: int = DEFAULT_CORPUS_MAX_TOKENS
    ) -> "CorpusIndex":
        """Build from a ``.jsonl`` file (fields ``turns``, ``text`` or ``prompt``; one document per
        string) or a plain text file (one document per blank-line-separated paragraph).

        Raises ValueError for a missing, unreadable, malformed or empty file."""
        texts = _read_corpus_texts(Path(path))
        corpus = CorpusIndex(_tokenize_lazily(texts, tokenize, max_tokens), max_tokens=max_tokens)
        logger.info(
            "corpus %s: %d documents, %d tokens", path, corpus.num_documents, corpus.num_tokens
        )
        return corpus


def _tokenize_lazily(
    texts: Iterable[str], tokenize: Callable[[str], list[int]], max_tokens: int
) -> Iterable[list[int]]:
    total = 0
    for text in texts:
        if total >= max_tokens:
            return
        ids = list(tokenize(text))
        total += len(ids)
        yield ids


def _read_corpus_texts(path: Path) -> list[str]:
    if not path.is_file():
        raise ValueError(f"corpus file {str(path)!r} does not exist or is not a file")
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read corpus file {str(path)!r}: {err}") from err
    if path.suffix.lower() in JSONL_SUFFIXES:
        texts = _parse_jsonl(raw, path)
    else:
        texts = [para.strip() for para in re.split(r"\n\s*\n", raw)]
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError(f"corpus file {str(path)!r} holds no text")
    return texts


def _parse_jsonl(raw: str, path: Path) -> list[str]:
    texts: list[str] = []
    for lineno, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            where = f"corpus {str(path)!r} line {lineno}"
            raise ValueError(f"{where}: invalid JSON ({err.msg})") from err
        texts.extend(_record_texts(record, path, lineno))
    return texts


def _record_texts(record: object, path: Path, lineno: int) -> list[str]:
    where = f"corpus {str(path)!r} line {lineno}"
    expected = "an object with a 'turns' (list of strings), 'text' or 'prompt' (string) field"
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected {expected}, got {type(record).__name__}")
    for key in JSONL_FIELDS:
        if key not in record:
            continue
        value = record[key]
        if key == "turns" and isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        if key != "turns" and isinstance(value, str):
            return [value]
        raise ValueError(f"{where}: field {key!r} has the wrong type ({type(value).__name__})")
    raise ValueError(f"{where}: expected {expected}")


# ----------------------------------------------------------------------------- drafter


class RetrievalDrafter:
    """Drafts continuations of the longest matching suffix of the context (or the corpus).

    The engine calls ``reset(prompt_ids)`` once per generation, ``propose(max_nodes)`` each step
    and ``extend(new_tokens)`` after each commit. ``max_occurrences`` bounds how many earlier
    occurrences feed one trie (not a RetrievalConfig knob)."""

    def __init__(
        self,
        cfg: RetrievalConfig,
        corpus: CorpusIndex | None = None,
        max_occurrences: int = DEFAULT_MAX_OCCURRENCES,
    ) -> None:
        self.cfg = cfg
        self.corpus = corpus
        self.max_occurrences = max_occurrences
        self.context = SuffixIndex(max_occurrences)
        self._corpus_state = 0  # streaming match of the context against the corpus
        self._corpus_len = 0

    def reset(self, prompt_tokens: Sequence[int]) -> None:
        self.context = SuffixIndex(self.max_occurrences)
        self._corpus_state, self._corpus_len = 0, 0
        self.extend(prompt_tokens)

    def extend(self, new_tokens: Sequence[int]) -> None:
        tokens = [int(t) for t in new_tokens]
        self.context.extend(tokens)
        if self.corpus is not None:
            for token in tokens:
                self._corpus_state, self._corpus_len = self.corpus.index.advance(
                    self._corpus_state, self._corpus_len, token
                )

    def propose(self, max_nodes: int) -> RetrievalProposal:
        """The proposal of the source with the longer match (ties: context). A source whose
        occurrences have no continuation (corpus document ends) does not compete."""
        best = self._propose_from(self.context, self.context.longest_match(), "context", max_nodes)
        if self.corpus is not None:
            ends = self.corpus.index.ends_before(self._corpus_state, len(self.corpus.index))
            match = SuffixMatch(self._corpus_len, ends)
            other = self._propose_from(self.corpus.index, match, "corpus", max_nodes)
            if other.tokens and (not best.tokens or other.match_len > best.match_len):
                best = other
        return best

    def _propose_from(
        self, index: SuffixIndex, match: SuffixMatch, source: str, max_nodes: int
    ) -> RetrievalProposal:
        if match.length < self.cfg.min_match or max_nodes <= 0 or not match.ends:
            return RetrievalProposal(match_len=match.length)
        conts = [index.continuation(end, self.cfg.max_continuation) for end in match.ends]
        tokens, parents, q = build_trie(
            conts, max_nodes, self.cfg.max_continuation, self.cfg.max_branches
        )
        return RetrievalProposal(match.length, tokens, parents, q, source, len(match.ends))
