"""Commit accepted tree nodes into a KV cache: the one module that touches cache internals."""

from __future__ import annotations

import torch
from transformers import Cache


def keep_entries(cache: Cache, keep_prefix: int, extra: list[int]) -> None:
    """Keep the first ``keep_prefix`` entries of every layer plus the entries at ``extra``
    (absolute indices, ascending, all >= keep_prefix); drop everything else.

    After verification the cache holds prefix + all tree nodes; keeping the accepted path
    makes it equal to the cache of a plain forward over prefix + accepted tokens.
    """
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.keys is None or layer.keys.numel() == 0:
            continue
        seq = layer.keys.shape[-2]
        if not extra and keep_prefix == seq:
            continue
        idx = torch.cat(
            [torch.arange(keep_prefix), torch.tensor(extra, dtype=torch.long)]
        ).to(layer.keys.device)  # (S',)
        layer.keys = layer.keys.index_select(-2, idx)  # (B, H, S', D)
        layer.values = layer.values.index_select(-2, idx)  # (B, H, S', D)
