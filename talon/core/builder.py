"""Tree builders: TALON's adaptive, confidence-gated tree and the static and chain baselines.

All three grow a ``DraftTree`` through one ``Expand`` callback: given frontier node ids, it
returns the drafter's top-k children of each, as (token, q) pairs. The model source answers
each call with one batched forward, so a tree costs one draft forward per layer. The tree may
arrive with nodes already grafted (retrieval); a proposed child that already exists is marked
``both`` and costs no budget.

Which nodes take the budget is decided by a ``Scores`` function of the tree: by default the
path confidence ``c`` (the raw product of q), and in the engine the acceptance model's calibrated
P(node accepted) (``talon.cost.plan.CalibratedAcceptance.node_probs``), so that expected accepted length,
not raw confidence, fills the budget. Either way a node's score never exceeds its parent's, which
keeps every best-N set ancestor closed. TALON's gates (mu x the layer's best ``c``) and the
``min_conf`` stop stay on path confidence: they limit what may expand, the scores rank it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Callable

from talon.core.contracts import Children, LayerPlanner
from talon.run_config import TreeConfig
from talon.tree import DraftTree, Gate

Expand = Callable[[DraftTree, list[int], int], list[Children]]  # DraftSource.expand
Scores = Callable[[DraftTree], Sequence[float]]  # (T,) per node, never above the parent's; root first
UNLIMITED = 10**9



def path_confidence(tree: DraftTree) -> list[float]:
    """The raw ranking: c = prod(q along the path)."""
    return tree.path_conf


def build_tree(
    tree: DraftTree,
    expand: Expand,
    cfg: TreeConfig,
    budget: int,
    planner: LayerPlanner | None = None,
    match_len: int = 0,
    scores: Scores = path_confidence,
) -> DraftTree:
    """Grow ``tree`` with model proposals up to ``budget`` draft nodes; ``tree.stop`` says why it
    stopped. With a ``planner`` (cost-aware), a layer is drafted only if it is expected to pay.
    ``scores`` ranks the nodes that compete for the budget (adaptive and static)."""
    if budget <= tree.num_draft:
        tree.stop = "budget"
        return tree
    if cfg.mode == "chain":
        return _build_chain(tree, expand, cfg, budget, planner, match_len)
    if cfg.mode == "static":
        return _build_static(tree, expand, cfg, budget, scores)
    return _build_adaptive(tree, expand, cfg, budget, planner, match_len, scores)


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


def _keep_best_layer(
    tree: DraftTree, layer: list[int], budget: int, scores: Scores
) -> tuple[DraftTree, list[int]]:
    """Cut ``tree`` to its best ``budget`` nodes (``keep_best``); returns it and the surviving
    ids of ``layer``, in their new numbering."""
    if tree.num_draft <= budget:
        return tree, layer
    kept, new_id = _prune_ids(tree, _best_ids(tree, budget, scores))
    return kept, [new_id[n] for n in layer if n in new_id]


def _build_adaptive(
    tree: DraftTree, expand: Expand, cfg: TreeConfig, budget: int, planner: LayerPlanner | None, match_len: int,
    scores: Scores,
) -> DraftTree:
    """TALON: an ungated top-K root layer, then confidence-gated layers. The budget is filled
    best-first across the whole tree, not layer by layer: after each layer only the ``budget``
    best-scored nodes stay, and a frontier node expands only if it passes the gate and could
    still place a child among them (a child never scores above its parent)."""
    root_layer = _admit(tree, _proposals(tree, expand, [0], cfg.root_k), UNLIMITED)
    tree, layer = _keep_best_layer(tree, root_layer, budget, scores)
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
            score = scores(tree)
            floor = min((score[i] for i in range(1, len(tree)) if tree.sources[i] == "model"), default=math.inf)
            frontier = [n for n in passing if score[n] > floor]
        if not frontier:
            stop = "budget"
            break
        if planner is not None and not planner.worth_layer(tree, frontier, cfg.top_k, budget, match_len):
            stop = "cost"
            break
        added = _admit(tree, _proposals(tree, expand, frontier, cfg.top_k), UNLIMITED)
        tree, layer = _keep_best_layer(tree, added, budget, scores)
        depth += 1
    tree.stop = stop
    return tree


def _build_static(tree: DraftTree, expand: Expand, cfg: TreeConfig, budget: int, scores: Scores) -> DraftTree:
    """The static baseline (EAGLE-2's shape): expand the top-k nodes of every layer to a fixed
    depth, then keep the best N, both ranked by ``scores`` like the adaptive tree, so that an
    equal-budget comparison sets shape against shape. The gate record holds path confidences:
    ``layer_max`` the layer's best c, ``threshold`` the lowest c among the nodes expanded."""
    layer = _admit(tree, _proposals(tree, expand, [0], cfg.root_k), UNLIMITED)
    for _ in range(cfg.max_depth - 1):
        score = scores(tree)
        best = sorted(layer, key=lambda n: -score[n])[: cfg.top_k]  # stable: ties keep the order of c
        if not best:
            break
        cutoff = min(tree.path_conf[n] for n in best)
        layer_max = max(tree.path_conf[n] for n in layer)
        for n in layer:
            tree.gates[n] = Gate(layer_max=layer_max, threshold=cutoff, passed=n in best)
        layer = _admit(tree, _proposals(tree, expand, best, cfg.top_k), UNLIMITED)
    tree.stop = "depth"
    return keep_best(tree, budget, scores)


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


def _best_ids(tree: DraftTree, budget: int, scores: Scores) -> set[int]:
    """Grafted (non-model) nodes plus the best model nodes by score, ``budget`` in all.

    A score never grows along a path, and ties break by node id, so the set contains every
    member's parent."""
    score = scores(tree)
    fixed = [i for i in range(1, len(tree)) if tree.sources[i] != "model"]
    ranked = sorted(
        (i for i in range(1, len(tree)) if tree.sources[i] == "model"),
        key=lambda i: (-score[i], i),
    )
    return set(fixed) | set(ranked[: max(budget - len(fixed), 0)])


def keep_best(tree: DraftTree, budget: int, scores: Scores = path_confidence) -> DraftTree:
    """Keep grafted (non-model) nodes plus the best model nodes by score, N in all."""
    kept = prune(tree, _best_ids(tree, budget, scores))
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
