"""Acceptance: which drafted nodes the target agrees with. Pure functions of tree and logits."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from talon.models.rng import categorical, check_device, uniform
from talon.trace import BonusKind
from talon.tree import DraftTree

TOPK = 5  # the target's alternatives recorded per node


@dataclass
class Acceptance:
    accepted: list[int]  # node ids on the accepted path, root first
    bonus_token: int  # the target's own token after the last accepted node
    p_target: list[float | None] = field(default_factory=list)  # per node: target prob (sampling)
    p_accept: list[float | None] = field(default_factory=list)  # per node: acceptance prob (sampling)
    # "bonus": the path ran to a leaf and the last token is a free draw from the target;
    # "resampled": a draft child of the last accepted node was rejected and the token replaces it
    # (under sampling drawn from the residual, under greedy the target's argmax)
    bonus_kind: BonusKind = "bonus"
    residual: list[tuple[int, float]] = field(default_factory=list)  # sampling: top of the residual


def bonus_kind(tree: DraftTree, last: int) -> BonusKind:
    """Was the step's last token drawn after a full path ("bonus") or after a rejection?"""
    return "resampled" if tree.children(last) else "bonus"


def target_topk(scores: torch.Tensor, are_probs: bool, k: int = TOPK) -> tuple[list[list[int]], list[list[float]]]:
    """(T, V) logits or probabilities -> the target's top-k token ids and probabilities per node.
    From logits, only the log-normaliser touches the whole vocabulary (no (T, V) softmax)."""
    k = min(k, scores.shape[-1])
    values, ids = scores.topk(k, dim=-1)  # (T, k)
    if are_probs:
        probs = values.double()
    else:
        probs = (values.double() - scores.double().logsumexp(dim=-1, keepdim=True)).exp()
    return ids.tolist(), [[round(p, 6) for p in row] for row in probs.tolist()]


def greedy_readout(logits: torch.Tensor, k: int = TOPK) -> tuple[list[int], tuple[list[list[int]], list[list[float]]]]:
    """(T, V) logits -> each node's argmax and its top-k ids and probabilities, with one copy
    to the host (a greedy verification's only one): the argmax is ``argmax`` itself, never the
    first of ``topk`` (which may order a tie differently)."""
    k = min(k, logits.shape[-1])
    values, ids = logits.topk(k, dim=-1)  # (T, k)
    logp = values.double() - logits.double().logsumexp(dim=-1, keepdim=True)  # (T, k)
    packed = torch.cat([logits.argmax(dim=-1, keepdim=True).double(), ids.double(), logp.exp()], dim=1).cpu()
    top1 = packed[:, 0].long().tolist()
    topk_ids = packed[:, 1:1 + k].long().tolist()
    probs = [[round(p, 6) for p in row] for row in packed[:, 1 + k:].tolist()]
    return top1, (topk_ids, probs)


def accept_greedy(tree: DraftTree, target_top1: list[int]) -> Acceptance:
    """Longest root-to-node path whose every token is the target's argmax after its parent,
    plus the bonus token (the argmax after the last accepted node)."""
    node = 0
    accepted = [0]
    while True:
        child = tree.child_with_token(node, target_top1[node])
        if child is None:
            return Acceptance(accepted, target_top1[node], bonus_kind=bonus_kind(tree, node))
        accepted.append(child)
        node = child


def warp_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """(T, V) logits -> (T, V) float64 probabilities of the target's sampling distribution:
    temperature, then top-k, then top-p (nucleus), in transformers' order."""
    # in place where it can be: at a 256-node tree and a 152k vocabulary each float64 copy is 312 MB
    scores = logits.to(torch.float64, copy=True).div_(temperature)  # a copy even from float64
    if 0 < top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[..., -1:]  # (T, 1)
        scores.masked_fill_(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=False)  # ascending
        cum = sorted_scores.softmax(dim=-1).cumsum_(dim=-1)
        del sorted_scores
        drop_sorted = cum <= (1 - top_p)
        del cum
        drop_sorted[..., -1] = False  # always keep the most likely token
        scores.masked_fill_(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    return scores.softmax(dim=-1)


def accept_sampling(tree: DraftTree, p_target: torch.Tensor, generator: torch.Generator) -> Acceptance:
    """Lossless multi-candidate acceptance (SpecInfer-style) on a tree of deterministic drafts.

    p_target: (T, V) the target's (warped) distribution after each node.
    Walk down from the root. At each accepted node try its children in order: draft x is
    accepted with probability p(x); on rejection x is zeroed in p and p is renormalised. When
    every child is rejected, the bonus token is sampled from what is left of p. This is
    sampling from p by sequential elimination, so each emitted token is distributed exactly as
    the target's. Talon's drafts are all deterministic (top-k of the draft model, retrieval
    continuations), so the min(1, p/q) rule for sampled drafts is not needed.
    """
    check_device(generator, p_target)  # before any draw: a mismatch fails the same way on every device
    n = len(tree)
    tried_p: list[float | None] = [None] * n
    tried_accept: list[float | None] = [None] * n
    node, accepted = 0, [0]
    while True:
        residual = p_target[node].clone()  # (V,)
        chosen = None
        for child in tree.children(node):
            x = tree.tokens[child]
            px = float(residual[x])
            tried_p[child], tried_accept[child] = float(p_target[node, x]), px
            if uniform(generator, residual) < px:
                chosen = child
                break
            residual[x] = 0.0
            residual = residual / residual.sum()
        if chosen is None:
            bonus = categorical(residual, generator)
            kind = bonus_kind(tree, node)
            top = residual.topk(min(TOPK, residual.shape[-1])) if kind == "resampled" else None
            left = list(zip(top.indices.tolist(), top.values.tolist())) if top is not None else []
            return Acceptance(accepted, bonus, tried_p, tried_accept, kind, left)
        accepted.append(chosen)
        node = chosen
