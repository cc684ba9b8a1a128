"""The drafters: who proposes the tokens of a draft tree.

* ``model``: :class:`ModelDrafter`, a small causal LM expanding a frontier per forward;
* ``suffix``: :class:`SuffixIndex`, an online suffix automaton over token ids;
* ``trie``: :func:`build_trie`, continuations of a match as a frequency trie (``RetrievalProposal``);
* ``corpus``: :class:`CorpusIndex`, a static datastore from a jsonl or text file;
* ``retrieval``: :class:`RetrievalDrafter`, context and corpus matches as proposals;
* ``hybrid``: :class:`TreeDrafter`, retrieval grafts first, the model's gated tree fills the rest;
  :func:`build_drafter` makes a run's;
* ``base``: the contracts, ``DraftSource`` (a draft model's half), ``Drafter`` and ``Verifier``
  (what the step loop calls), and the ``Draft`` / ``PreDraft`` records;
* ``SOURCES``: for every drafter kind a model drafts (``talon.knobs.DRAFTERS``), the function that
  makes a run's draft source.
"""

from collections.abc import Callable

from talon.drafters.corpus import CorpusIndex
from talon.drafters.base import Draft, Drafter, DraftSource, PreDraft, Verifier
from talon.drafters.tree_drafter import TreeDrafter, build_drafter
from talon.drafters.layer_skip import layer_skip_source
from talon.drafters.model import ModelDrafter, draft_model_source
from talon.drafters.retrieval import RetrievalDrafter
from talon.drafters.suffix import SuffixIndex, SuffixMatch
from talon.drafters.trie import RetrievalProposal, build_trie

# (SourceModels, RunConfig, prompt_len) -> DraftSource, by drafter kind
SOURCES: dict[str, Callable[..., DraftSource]] = {
    "hybrid": draft_model_source, "model": draft_model_source, "layerskip": layer_skip_source,
}

__all__ = [
    "CorpusIndex", "Draft", "DraftSource", "Drafter", "TreeDrafter", "ModelDrafter", "PreDraft",
    "RetrievalDrafter", "RetrievalProposal", "SOURCES", "SuffixIndex", "SuffixMatch", "Verifier", "build_drafter", "build_trie",
]
