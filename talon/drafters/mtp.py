"""A target's own MTP layers as a draft source (``talon.models.mtp`` holds the layers and their loading).

Pair j of a run is (the target's last hidden state at position j, token j + 1), at position id
j + 1, as transformers' ``MTPCandidateGenerator`` feeds it; a tree node at depth d feeds its
parent's output (``MtpLayer``'s, after its post norm, as transformers and SGLang chain it) with its
own token at position root + d. Every depth drafts with layer 0 (vLLM's and SGLang's rule for a
one-layer checkpoint); the cache and the cut after a commit are ``PairSource``'s, as an EAGLE-3
head's are.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

from talon.drafters.pairs import PairSource
from talon.models.mtp import MtpLayers, checkpoint_dir, load_mtp

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from talon.core.contracts import SourceModels
    from talon.run_config import RunConfig

# target -> its MTP layers, loaded once per target (the layers share its embedding and LM head)
LOADED: weakref.WeakKeyDictionary[PreTrainedModel, MtpLayers] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class MtpSource(PairSource):
    """A target's MTP layers as a draft source (``FeatureSource``): pair j at position j + 1."""

    position_lead = 1
    name = "an MTP layer"

    def __init__(self, layers: MtpLayers) -> None:
        super().__init__(layers, layers.feature_layers, layers.window)


def mtp_layers_of(target: PreTrainedModel, path: str) -> MtpLayers:
    """``target``'s MTP layers from its checkpoint ``path`` (a directory or a Hub id), loaded at first use."""
    with _LOCK:
        if target not in LOADED:
            LOADED[target] = load_mtp(target, checkpoint_dir(path))
        return LOADED[target]


def attach_mtp(target: PreTrainedModel, layers: MtpLayers) -> None:
    """Give ``target`` MTP layers built in memory (a check's, a test's), in place of its checkpoint's."""
    with _LOCK:
        LOADED[target] = layers


def mtp_source(models: SourceModels, cfg: RunConfig, prompt_len: int) -> MtpSource:
    """The ``mtp`` kinds' draft source: the target's own MTP layers (no draft model)."""
    target = models.target
    return MtpSource(mtp_layers_of(target.model, target.name))
