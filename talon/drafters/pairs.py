"""Draft sources on the target's own features, pair by pair: an EAGLE-3 head
(``talon.drafters.eagle3``) and a target's MTP layers (``talon.drafters.mtp``).

Pair j of a run is (the target's feature at position j, token j + 1): the committed pairs fill the
module's KV cache, at position id j + ``position_lead`` (0 for an EAGLE-3 head, 1 for MTP, which
places a pair at its token's position). A tree node at depth d >= 1 feeds its parent's output
with its own token at position root + d - 1 + ``position_lead``, and attends to the committed
pairs and its ancestors only: siblings never see each other. Only committed pairs carry the
target's real features, so after each step the tree's entries are cut and the accepted tokens are
fed again, at the next expansion, with the features their verification returned
(``add_features``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import torch
from transformers import DynamicCache

from talon.core.forward import additive_mask
from talon.core.kv import gather_entries
from talon.drafters.model import DraftLedger, PathKey, path_key
from talon.run_config import ConfigError
from talon.tree import DraftTree


class PairModule(Protocol):
    """One draft forward on (feature or parent output, token) pairs: an EAGLE-3 head, MTP layers."""

    dtype: torch.dtype
    feature_width: int  # F: the width of the target's features it reads
    vocab: int  # the target's vocabulary (the ids it embeds)

    def __call__(self, g: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, cache: DynamicCache,
                 mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """g: (T, F) features or (T, h) parents' outputs; ids, positions: (T,); mask: (1, 1, T, S + T)
        additive. Appends T cache entries; returns (T, h) outputs and (T, V) float32 logits."""


class PairSource(DraftLedger):
    """A ``FeatureSource`` over a ``PairModule``: its own KV cache over committed (feature, next
    token) pairs, then one entry per tree node it expands.

    ``context`` holds the committed tokens, root last; the root's pair is the last,
    j = len(context) - 2, and ``fed`` counts the pairs in the cache. ``window`` > 0: a node sees
    only the committed pairs fewer than ``window`` positions behind it (a sliding-window layer)."""

    position_lead = 0  # pair j sits at position id j + position_lead
    name = "a feature drafter"  # what errors call it

    def __init__(self, module: PairModule, feature_layers: tuple[int, ...], window: int = 0) -> None:
        self.model = module
        self.feature_layers = feature_layers
        self.window = window
        self.context: list[int] = []
        self.features: list[torch.Tensor] = []  # (F,) per committed position, in order
        self.cache = DynamicCache()
        self.fed = 0
        self.slots: dict[PathKey, int] = {}  # tree node -> cache index, this step only
        self.outs: dict[PathKey, torch.Tensor] = {}  # tree node -> its output (h,), this step only
        self.timings: list[tuple[int, float]] = []

    @property
    def pending(self) -> int:
        """Committed pairs the next expansion feeds first (the root's included)."""
        return max(len(self.context) - 1 - self.fed, 1)

    def reset(self, prompt_ids: list[int], prefill: bool = True) -> None:
        """Start a request. The prompt's pairs are fed at the first expansion: their features come
        from the target's prefill (``add_features``), after this call."""
        self.context, self.features = list(prompt_ids), []
        self.cache, self.fed, self.slots, self.outs, self.timings = DynamicCache(), 0, {}, {}, []

    def add_features(self, features: torch.Tensor) -> None:
        """(n, F): the target's features at the next n committed positions, in order."""
        self.features.extend(features.unbind(0))

    def target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """The module's output ids as the target's (an EAGLE-3 head's draft vocabulary maps)."""
        return ids

    def expand(self, tree: DraftTree, nodes: list[int], k: int) -> list[list[tuple[int, float]]]:
        """Top-k children (target token, q) of each node, with one forward."""
        start = time.perf_counter()
        fed = self.pending if nodes == [0] else len(nodes)
        _, logits = self._feed_context() if nodes == [0] else self._feed_nodes(tree, nodes)
        q, ids = torch.softmax(logits, dim=-1).topk(k, dim=-1)  # (T, k)
        tokens = self.target_ids(ids)
        result = [list(zip(t, p)) for t, p in zip(tokens.tolist(), q.tolist())]
        self.timings.append((max(fed, 1), time.perf_counter() - start))
        return result

    def _committed(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """(T, width) bool: which of the ``width`` committed pairs rows at ``rows`` positions see."""
        seen = torch.ones(rows.shape[0], width, dtype=torch.bool)
        if self.window:
            pair_pos = torch.arange(width) + self.position_lead  # (width,)
            seen &= rows[:, None] - pair_pos[None, :] < self.window
        return seen

    def _feed_context(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the committed pairs not yet in the cache; the last is the root's."""
        last = len(self.context) - 2  # the root's pair
        if last < 0:
            raise ConfigError(f"{self.name} needs a prompt of at least two tokens")
        if len(self.features) <= last:
            raise RuntimeError(f"{self.name} has features for {len(self.features)} positions, needs {last + 1}: "
                               "the verifier returned none (a forward that reads no features)")
        if self.fed > last:  # the root's pair is in the cache, its output is not: feed it again
            self.fed = last
            gather_entries(self.cache, list(range(self.fed)))
        g = torch.stack(self.features[self.fed:last + 1])  # (P, F)
        ids = torch.tensor(self.context[self.fed + 1:last + 2])  # (P,): each feature's next token
        positions = torch.arange(self.fed, last + 1) + self.position_lead
        t, past = ids.shape[0], self.cache.get_seq_length()
        visible = torch.ones(t, past + t, dtype=torch.bool).tril(diagonal=past)  # (P, S + P) causal
        visible &= self._committed(positions, past + t)
        out, logits = self.model(g, ids, positions, self.cache, additive_mask(visible, self.model.dtype))
        self.fed = last + 1
        self.slots, self.outs = {(): last}, {(): out[-1]}
        return out[-1:], logits[-1:]

    def _feed_nodes(self, tree: DraftTree, nodes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed ``nodes`` (one layer): each its parent's output and its own token, at depth past the root."""
        old = self.cache.get_seq_length()
        positions = torch.tensor([self.fed - 1 + self.position_lead + tree.depths[n] for n in nodes])
        visible = torch.zeros(len(nodes), old + len(nodes), dtype=torch.bool)  # (T, S + T)
        visible[:, : self.fed] = self._committed(positions, self.fed)
        for row, node in enumerate(nodes):
            for anc in tree.path(node)[1:-1]:
                visible[row, self.slots[path_key(tree, anc)]] = True
            visible[row, old + row] = True
        g = torch.stack([self.outs[path_key(tree, tree.parents[n])] for n in nodes])  # (T, h)
        ids = torch.tensor([tree.tokens[n] for n in nodes])
        out, logits = self.model(g, ids, positions, self.cache, additive_mask(visible, self.model.dtype))
        for row, node in enumerate(nodes):
            self.slots[path_key(tree, node)] = old + row
            self.outs[path_key(tree, node)] = out[row]
        return out, logits

    def commit(self, tree: DraftTree, accepted: list[int], new_tokens: list[int]) -> None:
        """Cut the tree's entries (their inputs were the module's guesses, not the target's
        features); the accepted tokens are fed again with their features at the next expansion."""
        if self.cache.get_seq_length() > self.fed:
            gather_entries(self.cache, list(range(self.fed)))
        self.slots, self.outs = {}, {}
        self.context.extend(new_tokens)


def pair_timer(module: PairModule, prefix: int, vocab: int, max_size: int) -> Callable[[int], float]:
    """The cost probe's timer for a pair module (``talon.cost.probe.Timer``): one forward of
    ``size`` tree nodes (fed parents' outputs) over ``prefix`` committed pairs; the nodes are dropped again."""
    cache = DynamicCache()
    host = torch.Generator("cpu").manual_seed(0)  # host tensors: the module moves them to its device
    features = torch.randn(prefix, module.feature_width, generator=host)  # (S, F)
    ids = torch.randint(0, min(module.vocab, 1000), (prefix + max_size,), generator=host)
    causal = torch.ones(prefix, prefix, dtype=torch.bool).tril()  # (S, S)
    with torch.inference_mode():
        out, _ = module(features, ids[:prefix], torch.arange(prefix), cache, additive_mask(causal, module.dtype))

    def time_once(size: int) -> float:
        visible = torch.ones(size, prefix + size, dtype=torch.bool)  # (T, S + T): one layer of siblings
        visible[:, prefix:] = torch.eye(size, dtype=torch.bool)
        g = out[-1:].expand(size, -1)
        with torch.inference_mode():
            start = time.perf_counter()
            mask = additive_mask(visible, module.dtype)
            _, logits = module(g, ids[prefix:prefix + size], torch.full((size,), prefix), cache, mask)
            logits.topk(1, dim=-1)[1].tolist()  # the layer's copy back, as a draft forward reads it
            seconds = time.perf_counter() - start
        gather_entries(cache, list(range(prefix)))
        return seconds

    return time_once
