"""For every drafter kind a model drafts (the knob table's ``DrafterKind.model``), the function
that makes a run's draft source from the engine's models (``SourceModels``)."""

from __future__ import annotations

from collections.abc import Callable

from talon.core.contracts import DraftSource
from talon.drafters.eagle3 import head_source
from talon.drafters.layer_skip import layer_skip_source
from talon.drafters.model import draft_model_source
from talon.drafters.mtp import mtp_source
from talon.knobs import DRAFTERS, DraftingModel

# which model drafts (the knob table's ``DrafterKind.model``) -> the maker of its draft source
BY_DRAFTING_MODEL: dict[DraftingModel, Callable[..., DraftSource]] = {
    "draft": draft_model_source, "head": head_source, "target": layer_skip_source, "mtp": mtp_source,
}
# (SourceModels, RunConfig, prompt_len) -> DraftSource, by drafter kind: every kind the table says a model drafts
SOURCE_MAKERS: dict[str, Callable[..., DraftSource]] = {
    name: BY_DRAFTING_MODEL[kind.model] for name, kind in DRAFTERS.items() if kind.model
}
