"""Retriever: continuations of the longest matching suffix, as a small frequency trie.

The context (prompt + generated tokens) lives in a :class:`SuffixIndex`, an online suffix
automaton over token ids (SAM-Decoding's datastore). After every appended token the automaton
knows, in O(1), the *match*: the longest suffix of the context that also ends at an earlier
position. The tokens that followed those earlier occurrences are the draft: up to
``max_occurrences`` of them (most recent first) are merged into a trie whose node confidence is
the continuation frequency, ``q(child) = count(child) / count(parent continuing)``.

An optional static :class:`CorpusIndex` (a suffix automaton over a jsonl/text datastore, built
once) is matched against the context with the classic streaming matcher, also O(1) amortised
per context token. :meth:`Retriever.propose` drafts from whichever source has the longer
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

import logging
from collections.abc import Sequence

from talon.drafters.corpus import CorpusIndex
from talon.drafters.suffix import DEFAULT_MAX_OCCURRENCES, SuffixIndex, SuffixMatch
from talon.drafters.trie import RetrievalProposal, build_trie
from talon.run_config import RetrievalConfig

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- drafter


class Retriever:
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

    def propose(self, max_nodes: int, min_match: int | None = None) -> RetrievalProposal:
        """The proposal of the source with the longer match (ties: context). A source whose
        occurrences have no continuation (corpus document ends) does not compete. ``min_match``
        overrides ``cfg.min_match`` (the planner lets one-token matches propose)."""
        shortest = self.cfg.min_match if min_match is None else min_match
        best = self._propose_from(self.context, self.context.longest_match(), "context", max_nodes, shortest)
        if self.corpus is not None:
            ends = self.corpus.index.ends_before(self._corpus_state, len(self.corpus.index))
            match = SuffixMatch(self._corpus_len, ends)
            other = self._propose_from(self.corpus.index, match, "corpus", max_nodes, shortest)
            if other.tokens and (not best.tokens or other.match_len > best.match_len):
                best = other
        return best

    def _propose_from(
        self, index: SuffixIndex, match: SuffixMatch, source: str, max_nodes: int, min_match: int
    ) -> RetrievalProposal:
        if match.length < max(min_match, 1) or max_nodes <= 0 or not match.ends:
            return RetrievalProposal(match_len=match.length)
        conts = [index.continuation(end, self.cfg.max_continuation) for end in match.ends]
        tokens, parents, q = build_trie(
            conts, max_nodes, self.cfg.max_continuation, self.cfg.max_branches
        )
        return RetrievalProposal(match.length, tokens, parents, q, source, len(match.ends))
