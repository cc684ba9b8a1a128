"""KV-cache surgery: the one module that touches cache internals."""

from __future__ import annotations

import copy

import torch
from transformers import Cache


def gather_entries(cache: Cache, idx: list[int]) -> None:
    """Keep only the entries at ``idx`` (absolute sequence indices, in that order), every layer.
    The index goes to each layer's own device (a model spread over GPUs has several), and the
    nothing-to-drop test is plain Python, so no op ever mixes a CPU tensor with a device's."""
    identity = idx == list(range(len(idx)))
    index = torch.tensor(idx, dtype=torch.long)  # (S',)
    on_device: dict[torch.device, torch.Tensor] = {}
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.keys is None or layer.keys.numel() == 0:
            continue
        if identity and len(idx) == layer.keys.shape[-2]:
            continue  # nothing to drop
        device = layer.keys.device
        if device not in on_device:
            on_device[device] = index.to(device)
        layer.keys = layer.keys.index_select(-2, on_device[device])  # (B, H, S', D)
        layer.values = layer.values.index_select(-2, on_device[device])  # (B, H, S', D)


def keep_entries(cache: Cache, keep_prefix: int, extra: list[int]) -> None:
    """Keep the first ``keep_prefix`` entries plus the entries at ``extra`` (ascending, all >=
    keep_prefix). After verification the cache holds prefix + every tree node; keeping the
    accepted path makes it equal to the cache of a plain forward over prefix + accepted tokens."""
    gather_entries(cache, list(range(keep_prefix)) + list(extra))


def clone_cache(cache: Cache) -> Cache:
    """An independent copy (the async pre-drafter works on a fork of the draft cache)."""
    return copy.deepcopy(cache)
