"""An EAGLE-3 head as a draft source (``talon.models.eagle3`` holds the head and its loading).

Pair j of a run is (the target's feature at position j, token j + 1), at position id j. The
committed pairs fill the head's KV cache; a tree node at depth d >= 1 feeds its parent's output
with its own token at position root + d and attends to the committed pairs and its ancestors, as
a draft model's node does. Only committed pairs carry the target's real features, so after each
step the tree's entries are dropped and the accepted tokens are fed again, at the next expansion,
with the features their verification returned (``add_features``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from talon.core.forward import additive_mask
from talon.core.kv import gather_entries
from talon.drafters.model import DraftLedger, PathKey, path_key
from talon.models.eagle3 import Eagle3Head, is_head
from talon.run_config import ConfigError
from talon.tree import DraftTree

if TYPE_CHECKING:
    from talon.core.contracts import SourceModels
    from talon.run_config import RunConfig


class HeadSource(DraftLedger):
    """An EAGLE-3 head as a draft source (``FeatureSource``): its own KV cache over committed
    (feature, next token) pairs, then one entry per tree node it expands.

    ``context`` holds the committed tokens, root last; pair j is (feature j, token j + 1), so the
    root's pair is the last, j = len(context) - 2, and ``fed`` counts the pairs in the cache."""

    def __init__(self, head: Eagle3Head, feature_layers: tuple[int, ...]) -> None:
        self.model = head
        self.feature_layers = feature_layers
        self.context: list[int] = []
        self.features: list[torch.Tensor] = []  # (3H,) per committed position, in order
        self.cache = DynamicCache()
        self.fed = 0
        self.slots: dict[PathKey, int] = {}  # tree node -> cache index, this step only
        self.outs: dict[PathKey, torch.Tensor] = {}  # tree node -> its out (h,), this step only
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
        """(n, 3H): the target's features at the next n committed positions, in order."""
        self.features.extend(features.unbind(0))

    def expand(self, tree: DraftTree, nodes: list[int], k: int) -> list[list[tuple[int, float]]]:
        """Top-k children (target token, q) of each node, with one head forward."""
        start = time.perf_counter()
        fed = self.pending if nodes == [0] else len(nodes)
        out, logits = self._feed_context(tree) if nodes == [0] else self._feed_nodes(tree, nodes)
        q, ids = torch.softmax(logits, dim=-1).topk(k, dim=-1)  # (T, k) over the draft vocabulary
        tokens = ids + self.model.d2t[ids]  # draft id -> target id
        result = [list(zip(t, p)) for t, p in zip(tokens.tolist(), q.tolist())]
        self.timings.append((max(fed, 1), time.perf_counter() - start))
        return result

    def _feed_context(self, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the committed pairs not yet in the cache; the last is the root's."""
        last = len(self.context) - 2  # the root's pair
        if last < 0:
            raise ConfigError("an EAGLE-3 head needs a prompt of at least two tokens")
        if len(self.features) <= last:
            raise RuntimeError(f"the head has features for {len(self.features)} positions, needs {last + 1}: "
                               "the verifier returned none (a forward that reads no features)")
        if self.fed > last:  # the root's pair is in the cache, its output is not: feed it again
            self.fed = last
            gather_entries(self.cache, list(range(self.fed)))
        g = torch.stack(self.features[self.fed:last + 1])  # (P, 3H)
        ids = torch.tensor(self.context[self.fed + 1:last + 2])  # (P,): each feature's next token
        positions = torch.arange(self.fed, last + 1)
        t, past = ids.shape[0], self.cache.get_seq_length()
        causal = torch.ones(t, past + t, dtype=torch.bool).tril(diagonal=past)  # (P, S + P)
        out, logits = self.model(g, ids, positions, self.cache, additive_mask(causal, self.model.dtype))
        self.fed = last + 1
        self.slots, self.outs = {(): last}, {(): out[-1]}
        return out[-1:], logits[-1:]

    def _feed_nodes(self, tree: DraftTree, nodes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed ``nodes`` (one layer): each its parent's out and its own token, at depth past the root."""
        old = self.cache.get_seq_length()
        visible = torch.zeros(len(nodes), old + len(nodes), dtype=torch.bool)  # (T, S + T)
        visible[:, : self.fed] = True
        for row, node in enumerate(nodes):
            for anc in tree.path(node)[1:-1]:
                visible[row, self.slots[path_key(tree, anc)]] = True
            visible[row, old + row] = True
        g = torch.stack([self.outs[path_key(tree, tree.parents[n])] for n in nodes])  # (T, h)
        ids = torch.tensor([tree.tokens[n] for n in nodes])
        positions = torch.tensor([self.fed - 1 + tree.depths[n] for n in nodes])
        out, logits = self.model(g, ids, positions, self.cache, additive_mask(visible, self.model.dtype))
        for row, node in enumerate(nodes):
            self.slots[path_key(tree, node)] = old + row
            self.outs[path_key(tree, node)] = out[row]
        return out, logits

    def commit(self, tree: DraftTree, accepted: list[int], new_tokens: list[int]) -> None:
        """Drop the tree's entries (their inputs were the head's guesses, not the target's
        features); the accepted tokens are fed again with their features at the next expansion."""
        if self.cache.get_seq_length() > self.fed:
            gather_entries(self.cache, list(range(self.fed)))
        self.slots, self.outs = {}, {}
        self.context.extend(new_tokens)


def head_source(models: SourceModels, cfg: RunConfig, prompt_len: int) -> HeadSource:
    """The ``eagle3`` kinds' draft source: the pair's draft slot holds an EAGLE-3 head."""
    head = models.draft.model if models.draft is not None else None
    if not is_head(head):
        raise ConfigError(f"drafter {cfg.drafter!r} needs an EAGLE-3 head as the draft (--draft DIR, a head's "
                          "checkpoint); use --drafter hybrid or model with a draft model")
    return HeadSource(head, head.cfg.layers_for(int(models.target.model.config.num_hidden_layers)))


def head_timer(head: Eagle3Head, prefix: int, vocab: int, max_size: int) -> Callable[[int], float]:
    """The cost probe's timer for a head (``talon.cost.probe.Timer``): one forward of ``size``
    tree nodes (fed parents' outputs) over ``prefix`` committed pairs; the nodes are dropped again."""
    cache = DynamicCache()
    host = torch.Generator("cpu").manual_seed(0)  # host tensors: the head moves them to its device
    features = torch.randn(prefix, 3 * head.cfg.target_hidden, generator=host)  # (S, 3H)
    ids = torch.randint(0, min(head.cfg.vocab, 1000), (prefix + max_size,), generator=host)
    causal = torch.ones(prefix, prefix, dtype=torch.bool).tril()  # (S, S)
    with torch.inference_mode():
        out, _ = head(features, ids[:prefix], torch.arange(prefix), cache, additive_mask(causal, head.dtype))

    def time_once(size: int) -> float:
        visible = torch.ones(size, prefix + size, dtype=torch.bool)  # (T, S + T): one layer of siblings
        visible[:, prefix:] = torch.eye(size, dtype=torch.bool)
        g = out[-1:].expand(size, -1)
        with torch.inference_mode():
            start = time.perf_counter()
            mask = additive_mask(visible, head.dtype)
            _, logits = head(g, ids[prefix:prefix + size], torch.full((size,), prefix), cache, mask)
            logits.topk(1, dim=-1)[1].tolist()  # the layer's copy back, as a draft forward reads it
            seconds = time.perf_counter() - start
        gather_entries(cache, list(range(prefix)))
        return seconds

    return time_once
