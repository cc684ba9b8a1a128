"""The forward toolkit: one forward of a causal LM over a block of tree nodes, on a KV cache.

The tree goes through the public interface only: a 4D additive float mask (0 = attend,
``finfo(dtype).min`` = masked) and explicit ``position_ids``. The same functions serve the
target's verification (the whole tree in one forward, ``talon.core.verify``), the draft model's
expansion of one frontier layer, an EAGLE-3 head's features, the atlas recorder and the cost
probe. The logits come from the LM head however it is packed: ``talon.models.head.lm_logits``.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Cache, PreTrainedModel

from talon.models.attention import fold_kwargs
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
