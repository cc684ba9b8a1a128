"""The LM head, however it is stored: its device, its rows, and the logits it gives.

The dispatch on how a model's weights are packed lives here, beside the packings: an int8 draft
(``talon.models.quant.int8_head``), a packed target's ``PackedLinear`` head, a prepacked one's
``PrepackedLinear`` head, or a plain ``nn.Linear``.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from talon.models.prepack import PrepackedLinear
from talon.models.quant import PackedLinear, int8_head


def head_device(model: PreTrainedModel) -> torch.device:
    """Where the LM head's weight lives, so where the logits (and every draw from them) are. With
    accelerate's multi-GPU placement that may be another GPU than ``model.device`` (the first)."""
    head = model.get_output_embeddings()
    return head.qweight.device if isinstance(head, PackedLinear) else head.weight.device


def head_rows(model: PreTrainedModel) -> int:
    """The LM head's output size: the vocabulary the logits cover (a shape: no device touched)."""
    head = model.get_output_embeddings()
    return head.out_features if isinstance(head, PackedLinear) else head.weight.shape[0]


@torch.inference_mode()
def lm_logits(model: PreTrainedModel, hidden: torch.Tensor, vocab_size: int = 0) -> torch.Tensor:
    """(T, H) -> (T, V) float32 logits; ``vocab_size`` > 0 keeps only the first V ids (draft heads).
    An int8 draft (``talon_quant``) uses its int8 head (:func:`talon.models.quant.int8_head`); a
    packed target its ``PackedLinear`` head; a prepacked one its ``PrepackedLinear`` head."""
    if getattr(model, "talon_quant", None) == "int8":
        return int8_head(model, vocab_size)(hidden)  # float32 in and out
    head = model.get_output_embeddings()
    if isinstance(head, PackedLinear):  # a packed target: its head, as generate() runs it
        logits = head(hidden.to(head_device(model))).float()
        return logits[:, :vocab_size] if vocab_size else logits
    if isinstance(head, PrepackedLinear) and not vocab_size:  # its oneDNN layout, as generate() runs it
        return head(hidden).float()
    weight = model.get_output_embeddings().weight  # (V_full, H)
    bias = model.get_output_embeddings().bias
    if vocab_size:
        weight = weight[:vocab_size]
        bias = None if bias is None else bias[:vocab_size]
    # F.linear bypasses accelerate's hooks: the hidden state goes to the head, not the other way
    logits = torch.nn.functional.linear(hidden.to(weight.device), weight, bias)
    return logits.float()
