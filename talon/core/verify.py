"""One forward of a causal LM over a block of tree nodes, on top of a KV cache.

The tree goes through the public interface only: a 4D additive float mask (0 = attend,
``finfo(dtype).min`` = masked) and explicit ``position_ids``. The same function serves the
target's verification (the whole tree in one forward) and the draft model's expansion of one
frontier layer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers import Cache, DynamicCache, PreTrainedModel

from talon.core.accept import accept_greedy, accept_sampling, greedy_readout, target_topk, warp_probs
from talon.core.contracts import Verdict
from talon.core.kv import keep_dynamic
from talon.models.attention import fold_kwargs
from talon.models.prepack import PrepackedLinear
from talon.models.quant import PackedLinear, int8_head
from talon.models.rng import generator_for
from talon.run_config import SamplingConfig
from talon.tree import DraftTree, ancestor_rows


def tree_mask(tree: DraftTree) -> torch.Tensor:
    """(T, T) bool: mask[i, j] is True iff node j is node i or one of its ancestors."""
    return torch.tensor(ancestor_rows(tree.parents), dtype=torch.bool)


def tree_positions(tree: DraftTree, prefix_len: int) -> torch.Tensor:
    """(T,) long: the absolute position of every node; the root sits at ``prefix_len``."""
    return prefix_len + torch.tensor(tree.depths, dtype=torch.long)


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(T, S) bool -> (1, 1, T, S) float: 0 where visible, the dtype's min elsewhere."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None]  # (1, 1, T, S)


def tree_visibility(ancestor_mask: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """(T, T) ancestor mask -> (T, prefix_len + T) bool: every node sees the prefix and its ancestors."""
    t = ancestor_mask.shape[0]
    prefix = torch.ones(t, prefix_len, dtype=torch.bool)
    return torch.cat([prefix, ancestor_mask], dim=1)  # (T, P + T)


@torch.inference_mode()
def forward_hidden(
    model: PreTrainedModel,
    cache: Cache,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    visible: torch.Tensor | None,
) -> torch.Tensor:
    """Run the decoder body over ``input_ids`` and append their KV to ``cache``.

    input_ids: (T,) long. positions: (T,) long absolute positions.
    visible: (T, S) bool over the cache's S - T old entries plus the T new ones; None = causal.
    Returns the last hidden states, (T, H).
    """
    return _decode(model, cache, input_ids, positions, visible, False).last_hidden_state[0]  # (T, H)


@torch.inference_mode()
def forward_features(
    model: PreTrainedModel,
    cache: Cache,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    visible: torch.Tensor | None,
    layers: tuple[int, ...],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``forward_hidden``, and the hidden states entering ``layers`` (HF ``output_hidden_states``
    indices: 0 the embeddings, i the input of layer i) concatenated: ((T, H), (T, len(layers) * H))."""
    out = _decode(model, cache, input_ids, positions, visible, True)
    features = torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)  # (T, 3H): low, mid, high
    return out.last_hidden_state[0], features


def _decode(model: PreTrainedModel, cache: Cache, input_ids: torch.Tensor, positions: torch.Tensor,
            visible: torch.Tensor | None, hidden_states: bool) -> Any:
    """The decoder body's forward (a transformers ``BaseModelOutputWithPast``)."""
    device = model.device
    kwargs: dict[str, Any] = {}
    if visible is not None:  # a tree's mask: GQA folded, not the keys and values repeated (talon.models.attention)
        kwargs = {"attention_mask": additive_mask(visible.to(device), model.dtype), **fold_kwargs(model)}
    if hidden_states:
        kwargs["output_hidden_states"] = True
    return model.get_decoder()(
        input_ids=input_ids[None].to(device),  # (1, T)
        position_ids=positions[None].to(device),  # (1, T)
        past_key_values=cache,
        use_cache=True,
        **kwargs,
    )


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
