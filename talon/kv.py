"""KV-cache surgery: the one module that touches cache internals."""

from __future__ import annotations

import copy

import torch
from transformers import Cache


def gather_entries(cache: Cache, idx: list[int]) -> None:
    """Keep only the entries at ``idx`` (absolute sequence indices, in that order), every layer."""
    index = torch.tensor(idx, dtype=torch.long)  # (S',)
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.keys is None or layer.keys.numel() == 0:
            continue
        seq = layer.keys.shape[-2]
        if len(idx) == seq and torch.equal(index, torch.arange(seq)):
            continue  # nothing to drop
        index = index.to(layer.keys.device)
        layer.keys = layer.keys.index_select(-2, index)  # (B, H, S', D)
        layer.values = layer.values.index_select(-2, index)  # (B, H, S', D)


def keep_entries(cache: Cache, keep_prefix: int, extra: list[int]) -> None:
    """Keep the first ``keep_prefix`` entries plus the entries at ``extra`` (ascending, all >=
    keep_prefix). After verification the cache holds prefix + every tree node; keeping the
    accepted path makes it equal to the cache of a plain forward over prefix + accepted tokens."""
    gather_entries(cache, list(range(keep_prefix)) + list(extra))


def clone_cache(cache: Cache) -> Cache:
    """An independent copy (the async pre-drafter works on a fork of the draft cache)."""
    return copy.deepcopy(cache)
