"""The verifier: the target scores a whole draft tree in one forward and accepts a path.

``verify_tree`` runs that forward (``talon.core.forward``) and returns the logits at every node;
``TargetVerifier`` turns them into a ``Verdict`` (greedy or sampled acceptance,
``talon.core.accept``) and keeps the accepted path's KV (``talon.core.kv``).
"""

from __future__ import annotations

import dataclasses

import torch
from transformers import Cache, DynamicCache, PreTrainedModel

from talon.core.accept import accept_greedy, accept_sampling, greedy_readout, target_topk, warp_probs
from talon.core.contracts import Verdict
from talon.core.forward import forward_features, forward_hidden, tree_mask, tree_positions, tree_visibility
from talon.core.kv import keep_dynamic
from talon.models.head import head_device, lm_logits
from talon.models.rng import generator_for
from talon.run_config import SamplingConfig
from talon.tree import DraftTree


@torch.inference_mode()
def verify_tree(
    model: PreTrainedModel,
    cache: Cache,
    tokens: list[int],
    ancestor_mask: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """One target forward over every tree node. Returns (T, V) float32 logits: row i is the
    target's next-token distribution after the path to node i."""
    prefix_len = cache.get_seq_length()
    visible = tree_visibility(ancestor_mask, prefix_len)  # (T, P + T)
    hidden = forward_hidden(model, cache, torch.tensor(tokens), positions, visible)
    return lm_logits(model, hidden)


class TargetVerifier:
    """Verification by the target model: its KV cache holds every committed token but the
    root; one forward scores the whole tree through the 4D tree mask."""

    def __init__(self, model: torch.nn.Module, sampling: SamplingConfig,
                 feature_layers: tuple[int, ...] = ()) -> None:
        """``feature_layers``: also return the target's hidden states entering these layers (an
        EAGLE-3 head's features, ``forward_features``) from the prefill and every verification."""
        self.model = model
        self.sampling = sampling
        self.feature_layers = feature_layers
        self.generator = generator_for(head_device(model), sampling.seed)  # where the target's probabilities live
        self.cache = DynamicCache(config=model.config)

    def prefill(self, ids: list[int]) -> torch.Tensor | None:
        if len(ids) <= 1:
            return None
        prompt, positions = torch.tensor(ids[:-1]), torch.arange(len(ids) - 1)
        if self.feature_layers:
            return forward_features(self.model, self.cache, prompt, positions, None, self.feature_layers)[1]
        forward_hidden(self.model, self.cache, prompt, positions, None)
        return None

    def verify(self, tree: DraftTree) -> Verdict:
        prefix_len = self.cache.get_seq_length()
        positions = tree_positions(tree, prefix_len)  # (T,)
        if not self.feature_layers:
            logits = verify_tree(self.model, self.cache, tree.tokens, tree_mask(tree), positions)
            return self.judge(tree, logits, positions)
        visible = tree_visibility(tree_mask(tree), prefix_len)  # (T, P + T)
        hidden, features = forward_features(self.model, self.cache, torch.tensor(tree.tokens), positions, visible,
                                            self.feature_layers)
        return dataclasses.replace(self.judge(tree, lm_logits(self.model, hidden), positions), features=features)

    def judge(self, tree: DraftTree, logits: torch.Tensor, positions: torch.Tensor) -> Verdict:
        """The verdict on ``tree`` from the target's (T, V) logits at its nodes."""
        s = self.sampling
        if s.greedy:
            top1, topk = greedy_readout(logits)  # one copy back
            acc = accept_greedy(tree, top1)
        else:
            top1 = logits.argmax(dim=-1).tolist()  # (T,)
            p_target = warp_probs(logits, s.temperature, s.top_k, s.top_p)  # (T, V)
            acc, topk = accept_sampling(tree, p_target, self.generator), target_topk(p_target, are_probs=True)
        return Verdict(top1, acc, topk, positions.tolist())

    def commit(self, verdict: Verdict) -> None:
        """Keep the KV of the accepted nodes (the root's included), drop the rest of the tree's."""
        prefix_len = verdict.positions[0]
        keep_dynamic(self.cache, prefix_len, [prefix_len + n for n in verdict.acceptance.accepted])

    def close(self) -> None:
        """The run is over (nothing to give back: the cache is the run's own)."""
