"""The drafters: who proposes the tokens of a draft tree (their contracts: ``talon.core.contracts``).

* ``model``: :class:`ModelSource`, a small causal LM expanding a frontier per forward;
* ``suffix``: :class:`SuffixIndex`, an online suffix automaton over token ids;
* ``trie``: :func:`build_trie`, continuations of a match as a frequency trie (``RetrievalProposal``);
* ``corpus``: :class:`CorpusIndex`, a static datastore from a jsonl or text file;
* ``retrieval``: :class:`Retriever`, context and corpus matches as proposals;
* ``tree_drafter``: :class:`TreeDrafter`, every drafter kind's drafter: retrieval grafts first, the
  model's gated tree fills the rest; :func:`build_drafter` makes a run's;
* ``eagle3``: :class:`HeadSource`, an EAGLE-3 head on the target's own features;
* ``SOURCE_MAKERS``: for every drafter kind a model drafts (``talon.knobs.DRAFTERS``), the function
  that makes a run's draft source.
"""

from collections.abc import Callable

from talon.core.contracts import DraftSource
from talon.drafters.corpus import CorpusIndex
from talon.drafters.eagle3 import HeadSource, head_source
from talon.drafters.layer_skip import layer_skip_source
from talon.drafters.model import ModelSource, draft_model_source
from talon.drafters.retrieval import Retriever
from talon.drafters.suffix import SuffixIndex, SuffixMatch
from talon.drafters.tree_drafter import TreeDrafter, build_drafter
from talon.drafters.trie import RetrievalProposal, build_trie
from talon.knobs import DRAFTERS, DraftingModel

# which model drafts (the knob table's ``DrafterKind.model``) -> the maker of its draft source
BY_DRAFTING_MODEL: dict[DraftingModel, Callable[..., DraftSource]] = {
    "draft": draft_model_source, "head": head_source, "target": layer_skip_source,
}
# (SourceModels, RunConfig, prompt_len) -> DraftSource, by drafter kind: every kind the table says a model drafts
SOURCE_MAKERS: dict[str, Callable[..., DraftSource]] = {
    name: BY_DRAFTING_MODEL[kind.model] for name, kind in DRAFTERS.items() if kind.model
}

__all__ = [
    "CorpusIndex", "HeadSource", "ModelSource", "Retriever", "RetrievalProposal", "SOURCE_MAKERS",
    "SuffixIndex", "SuffixMatch", "TreeDrafter", "build_drafter", "build_trie",
]
