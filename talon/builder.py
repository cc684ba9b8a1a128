"""Tree builders: TALON's adaptive, confidence-gated tree and the static and chain baselines.

All three grow a ``DraftTree`` through one ``Expand`` callback: given frontier node ids, it
returns the drafter's top-k children of each, as (token, q) pairs. The model drafter answers
each call with one batched forward, so a tree costs one draft forward per layer. The tree may
arrive with nodes already grafted (retrieval); a proposed child that already exists is marked
``both`` and costs no budget.
"""

from __future__ import annotations

from typing import Callable, Protocol

from talon.run_config import TreeConfig
from talon.tree import DraftTree, Gate

Expand = Callable[[DraftTree, list[int], int], list[list[tuple[int, float]]]]
UNLIMITED = 10**9

# Why a tree stopped growing (DraftTree.stop): the budget is full and no frontier node can place a
# child among the N best; max_depth reached; the best path confidence fell below min_conf; the
# next layer would not pay for itself (cost-aware); the drafter proposed nothing new; the draft
# model did not run this step (retrieval first, or not worth its prefill); a retrieval-only
# drafter's trie as proposed; no drafter at all (autoregressive).
STOPS: tuple[str, ...] = ("budget", "depth", "min_conf", "cost", "empty", "skipped", "retrieval", "none")


class LayerPlanner(Protocol):
    def worth_layer(self, tree: DraftTree, frontier: list[int], k: int, budget: int, match_len: int) -> bool: ...


def build_tree(
    tree: DraftTree,
    expand: Expand,
    cfg: TreeConfig,
    budget: int,
    planner: LayerPlanner | None = None,
    match_len: int = 0,
) -> DraftTree:
    """Grow ``tree`` with model proposals up to ``budget`` draft nodes; ``tree.stop`` says why it
    stopped. With a ``planner`` (cost-aware), a layer is drafted only if it is expected to pay."""
    if budget <= tree.num_draft:
        tree.stop = "budget"
        return tree
    if cfg.mode == "chain":
        return _build_chain(tree, expand, cfg, budget, planner, match_len)
    if cfg.mode == "static":
        return _build_static(tree, expand, cfg, budget)
    return _build_adaptive(tree, expand, cfg, budget, planner, match_len)


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


def _keep_best_layer(tree: DraftTree, layer: list[int], budget: int) -> tuple[DraftTree, list[int]]:
    """Cut ``tree`` to its best ``budget`` nodes (``keep_best``); returns it and the surviving
    ids of ``layer``, in their new numbering."""
    if tree.num_draft <= budget:
        return tree, layer
    kept, new_id = _prune_ids(tree, _best_ids(tree, budget))
    return kept, [new_id[n] for n in layer if n in new_id]


def _build_adaptive(
    tree: DraftTree, expand: Expand, cfg: TreeConfig, budget: int, planner: LayerPlanner | None, match_len: int
) -> DraftTree:
    """TALON: an ungated top-K root layer, then confidence-gated layers. The budget is filled
    best-first across the whole tree, not layer by layer: after each layer only the ``budget``
    most confident nodes stay, and a frontier node expands only if it passes the gate and could
    still place a child among them (a child is never more confident than its parent)."""
    tree, layer = _keep_best_layer(tree, _admit(tree, _proposals(tree, expand, [0], cfg.root_k), UNLIMITED), budget)
    depth, stop = 1, "depth"
    while True:
        if not layer:
            stop = "budget" if tree.num_draft >= budget else "empty"
            break
        passing = _gate_layer(tree, layer, cfg.mu)
        if depth >= cfg.max_depth:
            stop = "depth"
            break
        if max(tree.path_conf[n] for n in layer) < cfg.min_conf:
            stop = "min_conf"
            break
        frontier = passing
        if tree.num_draft >= budget:
            floor = min(tree.path_conf[i] for i in range(1, len(tree)) if tree.sources[i] == "model")
            frontier = [n for n in passing if tree.path_conf[n] > floor]
        if not frontier:
            stop = "budget"
            break
        if planner is not None and not planner.worth_layer(tree, frontier, cfg.top_k, budget, match_len):
            stop = "cost"
            break
        added = _admit(tree, _proposals(tree, expand, frontier, cfg.top_k), UNLIMITED)
        tree, layer = _keep_best_layer(tree, added, budget)
        depth += 1
    tree.stop = stop
    return tree


def _build_static(tree: DraftTree, expand: Expand, cfg: TreeConfig, budget: int) -> DraftTree:
    """EAGLE-2: expand the top-k nodes of every layer to a fixed depth, then keep the best N."""
    layer = _admit(tree, _proposals(tree, expand, [0], cfg.root_k), UNLIMITED)
    for _ in range(cfg.max_depth - 1):
        best = sorted(layer, key=lambda n: -tree.path_conf[n])[: cfg.top_k]
        if not best:
            break
        cutoff = tree.path_conf[best[-1]]
        layer_max = tree.path_conf[best[0]]
        for n in layer:
            tree.gates[n] = Gate(layer_max=layer_max, threshold=cutoff, passed=n in best)
        layer = _admit(tree, _proposals(tree, expand, best, cfg.top_k), UNLIMITED)
    tree.stop = "depth"
    return keep_best(tree, budget)


def _build_chain(
    tree: DraftTree, expand: Expand, cfg: TreeConfig, budget: int, planner: LayerPlanner | None, match_len: int
) -> DraftTree:
    """One path: the drafter's top-1 token, min(budget, max_depth) times."""
    node, stop = 0, "depth"
    for _ in range(min(budget, cfg.max_depth)):
        if planner is not None and not planner.worth_layer(tree, [node], 1, budget, match_len):
            stop = "cost"
            break
        admitted = _admit(tree, _proposals(tree, expand, [node], 1), budget)
        if not admitted:
            stop = "budget" if tree.num_draft >= budget else "empty"
            break
        node = admitted[0]
        if tree.path_conf[node] < cfg.min_conf:
            stop = "min_conf"
            break
    else:
        stop = "budget" if tree.num_draft >= budget else "depth"
    tree.stop = stop
    return tree


def _best_ids(tree: DraftTree, budget: int) -> set[int]:
    """Grafted (non-model) nodes plus the best model nodes by path confidence, ``budget`` in all.

    path_conf never grows along a path (q <= 1), and ties break by node id, so the set contains
    every member's parent."""
    fixed = [i for i in range(1, len(tree)) if tree.sources[i] != "model"]
    ranked = sorted(
        (i for i in range(1, len(tree)) if tree.sources[i] == "model"),
        key=lambda i: (-tree.path_conf[i], i),
    )
    return set(fixed) | set(ranked[: max(budget - len(fixed), 0)])


def keep_best(tree: DraftTree, budget: int) -> DraftTree:
    """Keep grafted (non-model) nodes plus the best model nodes by path confidence, N in all."""
    kept = prune(tree, _best_ids(tree, budget))
    kept.stop = tree.stop
    return kept


def prune(tree: DraftTree, keep: set[int]) -> DraftTree:
    """A new tree with the root and the ``keep`` nodes (ancestor-closed), order preserved."""
    return _prune_ids(tree, keep)[0]


def _prune_ids(tree: DraftTree, keep: set[int]) -> tuple[DraftTree, dict[int, int]]:
    out = DraftTree.with_root(tree.tokens[0])
    new_id = {0: 0}
    for i in range(1, len(tree)):
        if i in keep and tree.parents[i] in new_id:
            j = out.add(new_id[tree.parents[i]], tree.tokens[i], tree.q_draft[i], tree.sources[i])
            out.gates[j] = tree.gates[i]
            new_id[i] = j
    return out, new_id
