"""The drafter kinds, registered here and nowhere else.

A kind says which model drafts (``model``), whether retrieval from the text so far drafts too
(``retrieval``), and, where a model drafts, the function that makes its ``DraftSource`` for a
run (``source``: ``"module:function"``, imported when a run needs it, so that this table stays
plain data every layer may read). ``talon.drafters.hybrid.build_drafter`` combines the source and
retrieval under the tree's budget and gates; ``RunConfig.drafter`` takes any name here; the
command line, the app, the benchmark and the knob table offer them from here. How to add one:
docs/design.md, "Add a drafter".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DrafterKind:
    name: str
    model: str  # which model drafts: "draft" (the pair's draft model), "target" (the target itself), "" (none)
    retrieval: bool  # retrieval from the text so far drafts too
    summary: str  # one line: --help, docs/cli.md, the app
    source: str = ""  # "module:function" making the run's DraftSource: (SourceModels, RunConfig) -> DraftSource
    atlas: bool = True  # an atlas (which records the draft model's and retrieval's children) replays it

    def make_source(self) -> Callable[..., Any]:
        """The function that makes this kind's draft source (imported now)."""
        module, _, name = self.source.partition(":")
        return getattr(importlib.import_module(module), name)


DRAFT_MODEL = "talon.drafters.model:draft_model_source"

DRAFTERS: dict[str, DrafterKind] = {k.name: k for k in (
    DrafterKind("hybrid", "draft", True, "the draft model's gated tree with retrieval grafted in (Talon)", DRAFT_MODEL),
    DrafterKind("model", "draft", False, "the draft model alone", DRAFT_MODEL),
    DrafterKind("retrieval", "", True, "retrieval from the text so far alone (a suffix automaton; no model)"),
    DrafterKind("layerskip", "target", False,
                "self-speculative: the target itself with some of its layers skipped drafts (no second model)",
                "talon.drafters.layer_skip:layer_skip_source", atlas=False),
    DrafterKind("none", "", False, "nobody: the autoregressive baseline (one token a step)"),
)}
DRAFTER_KINDS: tuple[str, ...] = tuple(DRAFTERS)
DRAFTING_KINDS: tuple[str, ...] = tuple(k for k, d in DRAFTERS.items() if d.model or d.retrieval)  # the kinds that draft
ATLAS_KINDS: tuple[str, ...] = tuple(k for k, d in DRAFTERS.items() if d.atlas)  # the kinds an atlas replays
