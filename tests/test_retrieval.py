"""Retriever: suffix-automaton matching, continuation tries, corpus datastore.

Invariants: the match is the longest suffix that also ends at an earlier position (checked
against brute force); the incremental index equals one rebuilt from scratch; every drafted path
really follows an occurrence of the match; trie confidences are continuation frequencies; the
bounds (min_match, max_nodes, max_branches, max_continuation) hold; extend work is O(n).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talon.drafters import (
    CorpusIndex,
    RetrievalProposal,
    Retriever,
    SuffixIndex,
    build_trie,
)
from talon.run_config import RetrievalConfig

RETRIEVAL_WORDS = "a b c d e f g h p q r s x y z the quick brown fox jumps over lazy dog i saw it".split()
WORD_IDS = {w: i for i, w in enumerate(RETRIEVAL_WORDS)}


def enc(text: str) -> list[int]:
    return [WORD_IDS[w] for w in text.split()]


def drafter_on(text: str, **knobs: object) -> Retriever:
    drafter = Retriever(RetrievalConfig(**knobs))
    drafter.reset(enc(text))
    return drafter


# ----------------------------------------------------------------------------- brute force


def brute_ends(stream: Sequence[int], length: int, before: int) -> list[int]:
    """End positions j < ``before`` of the stream's length-``length`` suffix, latest first."""
    suffix = list(stream[len(stream) - length :])
    starts = range(before - 1, length - 2, -1)
    return [j for j in starts if list(stream[j - length + 1 : j + 1]) == suffix]


def brute_match_len(stream: Sequence[int]) -> int:
    """Longest L such that the suffix of length L also ends at some position j < n - 1."""
    best = 0
    for length in range(1, len(stream)):
        if not brute_ends(stream, length, len(stream) - 1):
            break
        best = length
    return best


def follows_match(stream: Sequence[int], match_len: int, path: list[int]) -> bool:
    """Does ``path`` occur right after an earlier occurrence of the length-``match_len`` suffix?"""
    ends = brute_ends(stream, match_len, len(stream) - 1)
    return any(list(stream[j + 1 : j + 1 + len(path)]) == path for j in ends)


def check_shape(prop: RetrievalProposal, cfg: RetrievalConfig, max_nodes: int) -> None:
    n = len(prop.tokens)
    assert len(prop.parents) == n and len(prop.q) == n
    assert n <= max_nodes
    assert all(-1 <= parent < i for i, parent in enumerate(prop.parents))
    assert all(depth <= cfg.max_continuation for depth in prop.depths)
    for parent in [-1, *range(n)]:
        kids = [i for i, p in enumerate(prop.parents) if p == parent]
        assert len(kids) <= cfg.max_branches
        assert len({prop.tokens[i] for i in kids}) == len(kids), "siblings hold distinct tokens"
        assert sum(prop.q[i] for i in kids) <= 1.0 + 1e-9
        counts = [prop.q[i] for i in kids]
        assert counts == sorted(counts, reverse=True), "children ordered by count"
    assert all(0.0 < q <= 1.0 for q in prop.q)


def check_q_against_occurrences(drafter: Retriever, prop: RetrievalProposal) -> None:
    """q(node) = #occurrences continuing with the node's path / #continuing past its parent."""
    stream = drafter.context.tokens
    depth = drafter.cfg.max_continuation
    conts = [stream[e + 1 : e + 1 + depth] for e in drafter.context.longest_match().ends]
    for node in range(len(prop)):
        path = prop.path(node)
        hits = sum(c[: len(path)] == path for c in conts)
        base = sum(c[: len(path) - 1] == path[:-1] and len(c) >= len(path) for c in conts)
        assert prop.q[node] == pytest.approx(hits / base)


# ----------------------------------------------------------------------------- hand cases


def test_match_and_chain_continuation() -> None:
    drafter = drafter_on("a b c d x a b c", max_continuation=4)
    prop = drafter.propose(max_nodes=10)
    assert prop.match_len == 3 and prop.source == "context" and prop.num_occurrences == 1
    assert prop.tokens == enc("d x a b")
    assert prop.parents == [-1, 0, 1, 2]
    assert prop.q == [1.0] * 4


def test_continuation_runs_to_the_end_of_the_stream() -> None:
    prop = drafter_on("a b c d x a b c", max_continuation=16).propose(max_nodes=32)
    assert prop.tokens == enc("d x a b c"), "the continuation stops where the context ends"


def test_overlapping_occurrence() -> None:
    prop = drafter_on("z a a a a", max_continuation=8).propose(max_nodes=8)
    assert prop.match_len == 3  # "a a a" ends at position 3 too
    assert prop.tokens == enc("a")


def test_branching_trie_confidences_and_order() -> None:
    drafter = drafter_on("p a b x q a b y r a b x s a b", max_continuation=3, max_branches=2)
    prop = drafter.propose(max_nodes=10)
    assert prop.match_len == 2 and prop.num_occurrences == 3
    assert prop.tokens[:2] == enc("x y") and prop.parents[:2] == [-1, -1]
    assert prop.q[:2] == pytest.approx([2 / 3, 1 / 3])
    under_x = [i for i, p in enumerate(prop.parents) if p == 0]
    assert [prop.tokens[i] for i in under_x] == enc("q s"), "equal counts: the earliest occurrence first"
    assert [prop.q[i] for i in under_x] == [0.5, 0.5]
    check_shape(prop, drafter.cfg, 10)
    check_q_against_occurrences(drafter, prop)


def test_min_match_gives_empty_proposal_but_reports_length() -> None:
    prop = drafter_on("a b c d x a b c", min_match=4).propose(max_nodes=10)
    assert prop.match_len == 3 and prop.tokens == [] and prop.source == "none"
    assert drafter_on("a b c d").propose(max_nodes=10).match_len == 0
    assert drafter_on("").propose(max_nodes=10) == RetrievalProposal()


@pytest.mark.parametrize("max_nodes", [0, 1, 2, 3, 5])
def test_max_nodes(max_nodes: int) -> None:
    drafter = drafter_on("p a b x q a b y r a b x s a b", max_continuation=4)
    prop = drafter.propose(max_nodes)
    assert len(prop) == min(max_nodes, len(drafter.propose(100)))
    check_shape(prop, drafter.cfg, max(max_nodes, 0))


def test_best_first_admission_prefers_the_confident_path() -> None:
    prop = drafter_on("p a b x q a b y r a b x s a b", max_continuation=4).propose(max_nodes=3)
    assert prop.tokens == enc("x y q") and prop.parents == [-1, -1, 0]


def test_max_branches_one_is_a_chain_of_the_majority() -> None:
    drafter = drafter_on("p a b x q a b y r a b x s a b", max_continuation=3, max_branches=1)
    prop = drafter.propose(max_nodes=10)
    assert prop.parents == [-1, 0, 1]
    assert prop.tokens == enc("x q a"), "after x, q and s tie: the earliest occurrence goes on"


def test_max_continuation_bounds_depth() -> None:
    drafter = drafter_on("a b c d e f g h z a b", max_continuation=3)
    prop = drafter.propose(max_nodes=10)
    assert prop.tokens == enc("c d e") and max(prop.depths) == 3


def test_build_trie_counts() -> None:
    conts = [[1, 2], [1, 3], [1, 2, 4], [5]]
    tokens, parents, q = build_trie(conts, max_nodes=10, max_depth=5, max_branches=4)
    assert tokens == [1, 2, 4, 5, 3]  # 5 and 3 tie at path confidence 1/4: 5 was queued first
    assert parents == [-1, 0, 1, -1, 0]
    assert q == pytest.approx([0.75, 2 / 3, 1.0, 0.25, 1 / 3])


def test_incremental_extend_matches_reset() -> None:
    stream = enc("a b c a b d a b c a b c d a b")
    inc = drafter_on("a b c")
    for token in stream[3:]:
        inc.extend([token])
    assert inc.propose(16) == drafter_on(" ".join(RETRIEVAL_WORDS[t] for t in stream)).propose(16)


# ----------------------------------------------------------------------------- properties


def _chunks(stream: list[int], sizes: list[int]) -> list[list[int]]:
    out, start = [], 0
    for size in sizes:
        if start >= len(stream):
            break
        out.append(stream[start : start + size])
        start += size
    if start < len(stream):
        out.append(stream[start:])
    return out


def check_against_rebuilt_and_brute(
    stream: list[int], sizes: list[int], cfg: RetrievalConfig, max_nodes: int
) -> None:
    """Feed ``stream`` in chunks; after each chunk compare with a rebuilt index and brute force."""
    chunks = _chunks(stream, sizes)
    incremental = Retriever(cfg)
    incremental.reset(chunks[0])
    seen = list(chunks[0])
    for chunk in [[], *chunks[1:]]:
        incremental.extend(chunk)
        seen += chunk
        rebuilt = Retriever(cfg)
        rebuilt.reset(seen)
        prop = incremental.propose(max_nodes)
        assert prop == rebuilt.propose(max_nodes)
        assert prop.match_len == brute_match_len(seen)
        match = incremental.context.longest_match()
        assert list(match.ends) == sorted(set(match.ends), reverse=True)
        assert all(follows_match(seen, prop.match_len, [seen[e + 1]]) for e in match.ends)
        check_shape(prop, cfg, max_nodes)
        if prop.match_len >= cfg.min_match:
            assert len(prop) >= 1
            check_q_against_occurrences(incremental, prop)
        for node in range(len(prop)):
            assert follows_match(seen, prop.match_len, prop.path(node))


@settings(derandomize=True, max_examples=300, deadline=None)
@given(
    stream=st.lists(st.integers(0, 4), min_size=1, max_size=200),
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    min_match=st.integers(1, 3),
    max_continuation=st.integers(1, 6),
    max_branches=st.integers(1, 3),
    max_nodes=st.integers(1, 12),
)
def test_incremental_equals_rebuilt_and_brute_force(
    stream: list[int],
    sizes: list[int],
    min_match: int,
    max_continuation: int,
    max_branches: int,
    max_nodes: int,
) -> None:
    cfg = RetrievalConfig(
        min_match=min_match, max_continuation=max_continuation, max_branches=max_branches
    )
    check_against_rebuilt_and_brute(stream, sizes, cfg, max_nodes)


@settings(derandomize=True, max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), alphabet=st.integers(2, 5), length=st.integers(100, 400))
def test_long_streams_equal_rebuilt_and_brute_force(seed: int, alphabet: int, length: int) -> None:
    rng = random.Random(seed)
    stream = rng.choices(range(alphabet), k=length)
    sizes = [rng.randint(1, 60) for _ in range(length)]
    cfg = RetrievalConfig(max_continuation=8)
    check_against_rebuilt_and_brute(stream, sizes, cfg, max_nodes=16)


@settings(derandomize=True, max_examples=60, deadline=None)
@given(stream=st.lists(st.integers(0, 2), min_size=2, max_size=150))
def test_frozen_index_has_exact_latest_occurrences(stream: list[int]) -> None:
    index = SuffixIndex(max_occurrences=3)
    index.extend(stream)
    index.freeze()
    state, length = 0, 0
    for token in stream[-5:]:
        state, length = index.advance(state, length, token)
    assert length == min(5, len(stream))
    truth = brute_ends(stream, length, len(stream))
    assert list(index.ends_before(state, len(stream))) == truth[:3]


def test_default_propagation_finds_latest_occurrence_on_random_text() -> None:
    rng = random.Random(0)
    stream = rng.choices(range(6), k=400)
    index = SuffixIndex()
    hits = 0
    for i, token in enumerate(stream):
        index.extend([token])
        match = index.longest_match()
        if match.length == 0:
            hits += 1
            continue
        hits += match.ends[0] == brute_ends(stream[: i + 1], match.length, i)[0]
    assert hits >= 0.97 * len(stream)


# ----------------------------------------------------------------------------- complexity


def _fibonacci_word(n: int) -> list[int]:
    a, b = [0], [0, 1]
    while len(b) < n:
        a, b = b, b + a
    return b[:n]


def _copying_stream(rng: random.Random, n: int) -> list[int]:
    """Blocks of 50 tokens, each either a repeated passage or fresh text."""
    out: list[int] = []
    while len(out) < n:
        out += rng.choice([list(range(50)), rng.choices(range(60), k=50)])
    return out[:n]


@pytest.mark.parametrize(
    "kind", ["random2", "random5", "random1000", "constant", "periodic", "fibonacci", "copying"]
)
def test_extend_work_is_linear(kind: str) -> None:
    n = 20_000
    rng = random.Random(7)
    streams = {
        "random2": lambda: rng.choices(range(2), k=n),
        "random5": lambda: rng.choices(range(5), k=n),
        "random1000": lambda: rng.choices(range(1000), k=n),
        "constant": lambda: [0] * n,
        "periodic": lambda: [i % 7 for i in range(n)],
        "fibonacci": lambda: _fibonacci_word(n),
        "copying": lambda: _copying_stream(rng, n),
    }
    stream = streams[kind]()
    index = SuffixIndex()
    for start in range(0, len(stream), 37):
        index.extend(stream[start : start + 37])
    # SAM walks < 6n (transitions created <= 3n, redirects amortised), end recording <= (B+1)n.
    assert index.work <= (6 + index.propagate_depth + 1) * len(stream)
    assert index.num_states <= 2 * len(stream)


# ----------------------------------------------------------------------------- corpus


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _jsonl(tmp_path: Path) -> str:
    lines = [
        {"turns": ["the quick brown fox jumps over the lazy dog", "i saw it"]},
        {"text": "a b c d e"},
        {"prompt": "x y z a b"},
    ]
    return _write(tmp_path, "corpus.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n\n")


def test_corpus_from_jsonl_prefers_longer_match(tmp_path: Path) -> None:
    corpus = CorpusIndex.from_file(_jsonl(tmp_path), enc)
    assert corpus.num_documents == 4 and corpus.num_tokens == 9 + 3 + 5 + 5
    drafter = Retriever(RetrievalConfig(max_continuation=8), corpus)
    drafter.reset(enc("i saw the quick brown fox"))
    prop = drafter.propose(16)
    assert prop.source == "corpus" and prop.match_len == 4
    assert prop.tokens == enc("jumps over the lazy dog")


def test_corpus_continuation_stops_at_document_end(tmp_path: Path) -> None:
    drafter = Retriever(RetrievalConfig(), CorpusIndex.from_file(_jsonl(tmp_path), enc))
    drafter.reset(enc("q c d"))
    prop = drafter.propose(16)
    assert prop.source == "corpus" and prop.tokens == enc("e")
    drafter.reset(enc("p x y z a b"))  # the only corpus occurrence ends its document
    assert drafter.propose(16).tokens == []


def test_context_wins_ties_and_longer_matches(tmp_path: Path) -> None:
    drafter = Retriever(RetrievalConfig(), CorpusIndex.from_file(_jsonl(tmp_path), enc))
    drafter.reset(enc("a b q r a b"))  # context "a b" -> q; corpus "a b" -> c: tie
    prop = drafter.propose(16)
    assert prop.source == "context" and prop.match_len == 2 and prop.tokens[0] == WORD_IDS["q"]
    drafter.extend(enc("c"))  # context "a b c" is new; corpus has "a b c" -> context match shorter
    prop = drafter.propose(16)
    assert prop.source == "corpus" and prop.match_len == 3 and prop.tokens == enc("d e")


def test_corpus_from_plain_text(tmp_path: Path) -> None:
    path = _write(tmp_path, "corpus.txt", "the quick brown fox\njumps over\n\n  \n\nthe lazy dog\n")
    corpus = CorpusIndex.from_file(path, enc)
    assert corpus.num_documents == 2
    drafter = Retriever(RetrievalConfig(), corpus)
    drafter.reset(enc("i saw the quick"))
    assert drafter.propose(16).tokens == enc("brown fox jumps over")


def test_corpus_max_tokens_truncates(tmp_path: Path) -> None:
    corpus = CorpusIndex.from_file(_jsonl(tmp_path), enc, max_tokens=10)
    assert corpus.num_tokens == 10


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"text": "a b"}\n{"text": "a b"\n', "line 2: invalid JSON"),
        ('["a b"]\n', "line 1: expected an object"),
        ('{"title": "a b"}\n', "line 1: expected an object"),
        ('{"turns": "a b"}\n', "field 'turns' has the wrong type"),
        ("\n\n", "holds no text"),
    ],
)
def test_malformed_corpus_raises_value_error(tmp_path: Path, content: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CorpusIndex.from_file(_write(tmp_path, "bad.jsonl", content), enc)


def test_missing_or_unreadable_corpus(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        CorpusIndex.from_file(str(tmp_path / "nope.jsonl"), enc)
    path = tmp_path / "binary.txt"
    path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ValueError, match="cannot read"):
        CorpusIndex.from_file(str(path), enc)
