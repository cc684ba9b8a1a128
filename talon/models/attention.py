"""Grouped-query attention over the static forward's slot cache without repeating its keys and
values.

The presets' models share each key/value head among several query heads (GQA: the 7B target 28
query heads on 4, the 0.5B draft 14 on 2). With a custom mask, transformers' ``sdpa`` copies each
layer's keys and values out to every query head first (``repeat_kv``) unless exactly one node is
scored outside ``torch.compile``. Over a slot cache of ``max_len`` slots that copy is most of an
attention's memory traffic: for the 7B target at 4096 slots, 58 MB written and read again a layer,
against 8 MB of keys and values; for the compiled draft forward, the copy is made at every bucket.
Here the query heads that share a key/value head are folded into its rows instead (a node's query
for each of the ``g`` heads becomes ``g`` rows of one head, the mask repeated to match), so
attention reads each key and value once, in one kernel, with the same mask and the same
arithmetic per row. ``pack_gqa`` is the same fold for one node.

It is registered as the attention implementation ``talon_sdpa``: a call without the
``fold_gqa`` flag is transformers' ``sdpa`` unchanged, so a model switched to it
(``set_fold``) computes exactly what it did wherever the flag is not passed. The forwards that
pass it (``fold_kwargs``, for a model switched to it) are the ones with a custom mask: the
static forward's steps and, on the dynamic cache, a tree's verification and a draft layer
(``talon.core.forward.forward_hidden``).

Whether an engine folds is its ``fold`` setting (``TALON_FOLD``): ``resolve_fold`` gives the
default a device kind has been proven on (``talon.settings.PROVEN``).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface, AttentionMaskInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from talon.settings import proven_default

NAME = "talon_sdpa"


def folded_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa`` (query (B, H, T, D), key and value (B, Hkv, L, D), an additive or
    boolean mask (B, 1, T, L)), with ``fold_gqa``: the ``g = H / Hkv`` query heads of a key/value
    head folded into ``g * T`` rows of it, no copy of the keys and values made. Returns (B, T, H,
    D), as ``sdpa`` does."""
    groups = getattr(module, "num_key_value_groups", 1)
    fold = kwargs.pop("fold_gqa", False)
    if (not fold or groups == 1 or attention_mask is None or attention_mask.dim() != 4
            or attention_mask.shape[1] != 1 or dropout or kwargs.get("softcap") is not None
            or kwargs.get("position_bias") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    b, h, t, d = query.shape
    kv, length = key.shape[1], key.shape[2]
    rows = query.reshape(b, kv, groups * t, d)  # head j * g + r's row i: head j's row r * T + i
    mask = attention_mask if t == 1 else \
        attention_mask[:, :, None].expand(b, 1, groups, t, length).reshape(b, 1, groups * t, length)
    out = torch.nn.functional.scaled_dot_product_attention(rows, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, h, t, value.shape[-1]).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, folded_sdpa)
AttentionMaskInterface.register(NAME, sdpa_mask)


def fold_kwargs(model: PreTrainedModel) -> dict[str, bool]:
    """What a forward of ``model`` with a 4D mask passes to fold: the flag where ``model`` was
    switched to fold (``set_fold``), else nothing."""
    return {"fold_gqa": True} if model.config._attn_implementation == NAME else {}


def resolve_fold(fold: bool | None, device: torch.device) -> bool:
    """``None`` (``TALON_FOLD=auto``): the default this device kind was proven on."""
    return proven_default("fold", device.type).value == "on" if fold is None else fold


def set_fold(model: PreTrainedModel, on: bool) -> bool:
    """Switch ``model`` between ``sdpa`` and ``talon_sdpa`` (the same attention until a forward
    asks to fold); True when it folds now. A model on another implementation (eager, flash) is
    left as it is and never folds."""
    current = model.config._attn_implementation
    wanted, other = (NAME, "sdpa") if on else ("sdpa", NAME)
    if current == other:
        model.set_attn_implementation(wanted)
    return model.config._attn_implementation == NAME
