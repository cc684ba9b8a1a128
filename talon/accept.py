"""Acceptance: which drafted nodes the target agrees with. Pure functions of tree and logits."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from talon.tree import DraftTree


@dataclass
class Acceptance:
    accepted: list[int]  # node ids on the accepted path, root first
    bonus_token: int  # the target's own token after the last accepted node
    p_target: list[float | None] = field(default_factory=list)  # per node: target prob (sampling)
    p_accept: list[float | None] = field(default_factory=list)  # per node: acceptance prob (sampling)


def accept_greedy(tree: DraftTree, target_top1: list[int]) -> Acceptance:
    """Longest root-to-node path whose every token is the target's argmax after its parent,
    plus the bonus token (the argmax after the last accepted node)."""
    node = 0
    accepted = [0]
    while True:
        child = tree.child_with_token(node, target_top1[node])
        if child is None:
            return Acceptance(accepted=accepted, bonus_token=target_top1[node])
        accepted.append(child)
        node = child
