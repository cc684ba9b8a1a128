"""KV-cache surgery: the one module that touches cache internals.

The KV cut (``talon.core.contracts.KVCut``) has two implementations here: ``keep_dynamic`` on a
cache that grows (transformers' ``DynamicCache``: the target's and the draft model's on the
dynamic forward) and ``keep_slots`` on preallocated slots (``talon.graphs.static``)."""

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


def keep_dynamic(cache: Cache, start: int, slots: list[int]) -> None:
    """The KV cut on a growing cache: keep the first ``start`` entries plus the entries at
    ``slots`` (ascending, all >= start), drop the rest. After verification the cache holds
    prefix + every tree node; keeping the accepted path makes it equal to the cache of a plain
    forward over prefix + accepted tokens."""
    gather_entries(cache, list(range(start)) + list(slots))


def keep_slots(cache: Cache, start: int, slots: list[int]) -> None:
    """The KV cut on preallocated slots: move the entries at ``slots`` (each >= ``start``) to
    ``start .. start + K - 1``, every layer, in place (gathered first, so a source overwritten
    early is read intact). Entries already in place are left alone: a step that kept only its
    root moves nothing. Slots past ``start + K`` keep stale entries no later mask shows."""
    skip = 0
    while skip < len(slots) and slots[skip] == start + skip:
        skip += 1
    if skip == len(slots):
        return
    on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
    for layer in cache.layers:
        for store in (layer.keys, layer.values):  # (B, H, S, D)
            if store.device not in on_device:
                src = torch.tensor(slots[skip:], dtype=torch.long).to(store.device, non_blocking=True)
                on_device[store.device] = src, torch.arange(start + skip, start + len(slots), device=store.device)
            src, dst = on_device[store.device]
            store.index_copy_(2, dst, store.index_select(2, src))


def clone_cache(cache: Cache) -> Cache:
    """An independent copy (the async pre-drafter works on a fork of the draft cache)."""
    return copy.deepcopy(cache)
