"""An EAGLE-3 head as a draft source (``talon.models.eagle3`` holds the head and its loading).

Pair j of a run is (the target's feature at position j, token j + 1), at position id j. The
committed pairs fill the head's KV cache; a tree node at depth d >= 1 feeds its parent's output
with its own token at position root + d - 1 and attends to the committed pairs and its ancestors,
as a draft model's node does (``talon.drafters.pairs.PairSource``, which a target's MTP layers
draft with too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from talon.drafters.pairs import PairSource
from talon.models.eagle3 import Eagle3Head, is_head
from talon.run_config import ConfigError

if TYPE_CHECKING:
    from talon.core.contracts import SourceModels
    from talon.run_config import RunConfig


class HeadSource(PairSource):
    """An EAGLE-3 head as a draft source (``FeatureSource``; ``PairSource`` holds the drafting):
    pair j (feature j, token j + 1) at position id j, its draft ids mapped to the target's by ``d2t``."""

    position_lead = 0
    name = "an EAGLE-3 head"

    def __init__(self, head: Eagle3Head, feature_layers: tuple[int, ...]) -> None:
        super().__init__(head, feature_layers)

    def target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids + self.model.d2t[ids]  # draft id -> target id


def head_source(models: SourceModels, cfg: RunConfig, prompt_len: int) -> HeadSource:
    """The ``eagle3`` kinds' draft source: the pair's draft slot holds an EAGLE-3 head."""
    head = models.draft.model if models.draft is not None else None
    if not is_head(head):
        raise ConfigError(f"drafter {cfg.drafter!r} needs an EAGLE-3 head as the draft (--draft DIR, a head's "
                          "checkpoint); use --drafter hybrid or model with a draft model")
    return HeadSource(head, head.cfg.layers_for(int(models.target.model.config.num_hidden_layers)))
