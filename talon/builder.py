"""Tree builders: TALON's adaptive, confidence-gated tree and the static and chain baselines.

All three grow a ``DraftTree`` through one ``Expand`` callback: given frontier node ids, it
returns the drafter's top-k children of each, as (token, q) pairs. The model drafter answers
each call with one batched forward, so a tree costs one draft forward per layer. The tree may
arrive with nodes already grafted (retrieval); a proposed child that already exists is marked
``both`` and costs no budget.
"""

from __future__ import annotations

from typing import Callable

from talon.config import TreeConfig
from talon.tree import DraftTree, Gate

Expand = Callable[[DraftTree, list[int], int], list[list[tuple[int, float]]]]


def build_tree(tree: DraftTree, expand: Expand, cfg: TreeConfig, budget: int) -> DraftTree:
    """Grow ``tree`` with model proposals until it holds ``budget`` draft nodes (or stops early)."""
    if budget <= tree.num_draft:
        return tree
    if cfg.mode == "chain":
        return _build_chain(tree, expand, cfg, budget)
    if cfg.mode == "static":
        return _build_static(tree, expand, cfg, budget)
    return _build_adaptive(tree, expand, cfg, budget)


def _admit(
    tree: DraftTree,
    candidates: list[tuple[float, int, int, float]],
    budget: int,
) -> list[int]:
    """Admit (path_conf, parent, token, q) candidates, best first, while the budget lasts.
    Returns the admitted node ids (merged duplicates included, they are free)."""
    admitted = []
    for _, parent, token, q in sorted(candidates, key=lambda c: -c[0]):
        existing = tree.child_with_token(parent, token)
        if existing is not None:
            if tree.sources[existing] == "retrieval":
                tree.sources[existing] = "both"
            admitted.append(existing)
        elif tree.num_draft < budget:
            admitted.append(tree.add(parent, token, q, "model"))
    return admitted


def _proposals(
    tree: DraftTree, expand: Expand, nodes: list[int], k: int
) -> list[tuple[float, int, int, float]]:
    children = expand(tree, nodes, k)
    return [
        (tree.path_conf[parent] * q, parent, token, q)
        for parent, kids in zip(nodes, children)
        for token, q in kids
    ]


def _gate_layer(tree: DraftTree, layer: list[int], mu: float) -> list[int]:
    """Record the gate on every node of ``layer``; return those that pass."""
    layer_max = max(tree.path_conf[n] for n in layer)
    threshold = mu * layer_max
    passing = []
    for n in layer:
        passed = tree.path_conf[n] >= threshold
        tree.gates[n] = Gate(layer_max=layer_max, threshold=threshold, passed=passed)
        if passed:
            passing.append(n)
    return passing


def _build_adaptive(tree: DraftTree, expand: Expand, cfg: TreeConfig, budget: int) -> DraftTree:
    """TALON: ungated top-K root layer, then gated layers filled best-first until the budget is spent."""
    layer = _admit(tree, _proposals(tree, expand, [0], cfg.root_k), budget)
    depth = 1
    while layer and depth < cfg.max_depth:
        passing = _gate_layer(tree, layer, cfg.mu)
        if tree.num_draft >= budget or max(tree.path_conf[n] for n in layer) < cfg.min_conf:
            break
        layer = _admit(tree, _proposals(tree, expand, passing, cfg.top_k), budget)
        depth += 1
    if layer and any(tree.gates[n] is None for n in layer):
        _gate_layer(tree, layer, cfg.mu)  # what the gate would say: drawn, never acted on
    return tree


def _build_static(tree: DraftTree, expand: Expand, cfg: TreeConfig, budget: int) -> DraftTree:
    """EAGLE-2: expand the top-k nodes of every layer to a fixed depth, then keep the best N."""
    layer = _admit(tree, _proposals(tree, expand, [0], cfg.root_k), 10**9)
    for _ in range(cfg.max_depth - 1):
        best = sorted(layer, key=lambda n: -tree.path_conf[n])[: cfg.top_k]
        if not best:
            break
        cutoff = tree.path_conf[best[-1]]
        layer_max = tree.path_conf[best[0]]
        for n in layer:
            tree.gates[n] = Gate(layer_max=layer_max, threshold=cutoff, passed=n in best)
        layer = _admit(tree, _proposals(tree, expand, best, cfg.top_k), 10**9)
    return keep_best(tree, budget)


def _build_chain(tree: DraftTree, expand: Expand, cfg: TreeConfig, budget: int) -> DraftTree:
    """One path: the drafter's top-1 token, min(budget, max_depth) times."""
    node = 0
    for _ in range(min(budget, cfg.max_depth)):
        admitted = _admit(tree, _proposals(tree, expand, [node], 1), budget)
        if not admitted:
            break
        node = admitted[0]
        if tree.path_conf[node] < cfg.min_conf:
            break
    return tree


def keep_best(tree: DraftTree, budget: int) -> DraftTree:
    """Keep grafted (non-model) nodes plus the best model nodes by path confidence, N in all.

    path_conf never grows along a path (q <= 1), and ties break by node id, so the kept set
    contains every kept node's parent."""
    fixed = [i for i in range(1, len(tree)) if tree.sources[i] != "model"]
    ranked = sorted(
        (i for i in range(1, len(tree)) if tree.sources[i] == "model"),
        key=lambda i: (-tree.path_conf[i], i),
    )
    keep = set(fixed) | set(ranked[: max(budget - len(fixed), 0)])
    return prune(tree, keep)


def prune(tree: DraftTree, keep: set[int]) -> DraftTree:
    """A new tree with the root and the ``keep`` nodes (ancestor-closed), order preserved."""
    out = DraftTree.with_root(tree.tokens[0])
    new_id = {0: 0}
    for i in range(1, len(tree)):
        if i in keep and tree.parents[i] in new_id:
            j = out.add(new_id[tree.parents[i]], tree.tokens[i], tree.q_draft[i], tree.sources[i])
            out.gates[j] = tree.gates[i]
            new_id[i] = j
    return out
