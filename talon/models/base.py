"""What every loading step shares: ``ModelLoadError`` (a failure a user can fix, with a message
that says what to do) and ``LoadedModel`` (a model and its tokenizer, ready for decoding)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the error imports no torch: the views' presets and memory checks raise it
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says why and what to do about it."""


@dataclass(frozen=True)
class LoadedModel:
    """A causal LM ready for decoding: eval mode, on ``device``, in ``dtype``."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str  # local directory or Hub id; from_pretrained(name) loads the same weights
    dtype: torch.dtype
    device: torch.device
