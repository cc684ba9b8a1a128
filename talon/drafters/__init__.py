"""The drafters: who proposes the tokens of a draft tree (their contracts: ``talon.core.contracts``).

* ``model``: :class:`ModelSource`, a small causal LM expanding a frontier per forward;
* ``suffix``: :class:`SuffixIndex`, an online suffix automaton over token ids;
* ``trie``: :func:`build_trie`, continuations of a match as a frequency trie (``RetrievalProposal``);
* ``corpus``: :class:`CorpusIndex`, a static datastore from a jsonl or text file;
* ``retrieval``: :class:`Retriever`, context and corpus matches as proposals;
* ``tree_drafter``: :class:`TreeDrafter`, every drafter kind's drafter: retrieval grafts first, the
  model's gated tree fills the rest; :func:`build_drafter` makes a run's;
* ``eagle3``: :class:`HeadSource`, an EAGLE-3 head on the target's own features;
* ``sources``: ``SOURCE_MAKERS``, for every drafter kind a model drafts (``talon.knobs.DRAFTERS``),
  the function that makes a run's draft source.

The names below are re-exported, imported on first use: the retrieval modules (``suffix``,
``trie``, ``corpus``, ``retrieval``) import no torch, and a view that reads a suffix index stays
free of the model drafters' torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CorpusIndex": "talon.drafters.corpus",
    "HeadSource": "talon.drafters.eagle3",
    "ModelSource": "talon.drafters.model",
    "Retriever": "talon.drafters.retrieval",
    "RetrievalProposal": "talon.drafters.trie",
    "SOURCE_MAKERS": "talon.drafters.sources",
    "SuffixIndex": "talon.drafters.suffix",
    "SuffixMatch": "talon.drafters.suffix",
    "TreeDrafter": "talon.drafters.tree_drafter",
    "build_drafter": "talon.drafters.tree_drafter",
    "build_trie": "talon.drafters.trie",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


__all__ = sorted(_EXPORTS)
