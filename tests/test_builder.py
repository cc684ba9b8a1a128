"""Tree builders on synthetic drafters: budget, order, shape and recorded gates."""

from __future__ import annotations

import math

import pytest

from talon.builder import build_tree
from talon.run_config import TreeConfig
from talon.shape import layer_width
from talon.tree import DraftTree


def synthetic(peak: float, vocab: int = 50):
    """A drafter whose top-1 has probability ``peak`` and the rest share what is left."""
    calls: list[list[int]] = []

    def expand(tree: DraftTree, nodes: list[int], k: int):
        calls.append(list(nodes))
        rest = (1 - peak) / (vocab - 1)
        out = []
        for n in nodes:
            base = (tree.tokens[n] * 7 + 1) % vocab
            probs = [peak] + [rest] * (k - 1)
            out.append([((base + i) % vocab, p) for i, p in enumerate(probs)])
        return out

    expand.calls = calls
    return expand


def check_order(tree: DraftTree) -> None:
    assert tree.parents[0] == -1
    assert all(0 <= tree.parents[i] < i for i in range(1, len(tree)))
    for i in range(1, len(tree)):
        assert math.isclose(tree.path_conf[i], tree.path_conf[tree.parents[i]] * tree.q_draft[i])


@pytest.mark.parametrize("mode", ["adaptive", "static"])
@pytest.mark.parametrize("budget", [1, 7, 24, 60])
@pytest.mark.parametrize("peak", [0.05, 0.5, 0.95])
def test_budget_is_respected_exactly(mode: str, budget: int, peak: float) -> None:
    cfg = TreeConfig(mode=mode, budget=budget, root_k=8, top_k=4, mu=0.0, max_depth=10, min_conf=0.0)
    tree = build_tree(DraftTree.with_root(3), synthetic(peak), cfg, budget)
    assert tree.num_draft == budget  # mu = 0 never gates: the budget is the only limit
    check_order(tree)


def test_chain_shape() -> None:
    cfg = TreeConfig(mode="chain", budget=5, max_depth=8, min_conf=0.0)
    tree = build_tree(DraftTree.with_root(3), synthetic(0.6), cfg, 5)
    assert tree.parents == [-1, 0, 1, 2, 3, 4] and max(tree.depths) == 5
    cfg = TreeConfig(mode="chain", budget=20, max_depth=4, min_conf=0.0)
    assert build_tree(DraftTree.with_root(3), synthetic(0.6), cfg, 20).num_draft == 4


def test_static_shape_is_eagle2() -> None:
    expand = synthetic(0.5)
    cfg = TreeConfig(mode="static", budget=10, root_k=4, top_k=2, mu=0.1, max_depth=3)
    tree = build_tree(DraftTree.with_root(3), expand, cfg, 10)
    assert [len(c) for c in expand.calls] == [1, 2, 2]  # root, then the top-2 of each layer
    assert tree.num_draft == 10 and max(tree.depths) <= 3
    check_order(tree)


def test_peaked_drafter_grows_deep_and_narrow_flat_one_shallow_and_wide() -> None:
    cfg = TreeConfig(mode="adaptive", budget=24, root_k=6, top_k=3, mu=0.1, max_depth=12)
    peaked = build_tree(DraftTree.with_root(3), synthetic(0.95), cfg, 24)
    flat = build_tree(DraftTree.with_root(3), synthetic(0.02), cfg, 24)
    assert max(peaked.depths) >= 5 and layer_width(peaked.depths) <= 6
    assert max(flat.depths) <= 2 and layer_width(flat.depths) >= 6
    assert max(peaked.depths) > 2 * max(flat.depths)


def test_recorded_gates_follow_the_rule() -> None:
    cfg = TreeConfig(mode="adaptive", budget=30, root_k=5, top_k=3, mu=0.2, max_depth=6)
    expand = synthetic(0.7)
    tree = build_tree(DraftTree.with_root(3), expand, cfg, 30)
    expanded = {n for call in expand.calls for n in call}
    for n in range(1, len(tree)):
        gate = tree.gates[n]
        if gate is None:
            continue
        layer = [m for m in range(1, len(tree)) if tree.depths[m] == tree.depths[n] and tree.gates[m]]
        assert math.isclose(gate.layer_max, max(tree.path_conf[m] for m in layer))
        assert math.isclose(gate.threshold, cfg.mu * gate.layer_max)
        assert gate.passed == (tree.path_conf[n] >= gate.threshold)
        if n in expanded:
            assert gate.passed
    assert tree.gates[0] is None  # the root layer is never gated


def test_grafted_nodes_are_merged_and_cost_no_budget() -> None:
    tree = DraftTree.with_root(3)
    first = (3 * 7 + 1) % 50  # the synthetic drafter's top-1 after the root
    r1 = tree.add(0, first, 1.0, "retrieval")
    tree.add(r1, 999, 1.0, "retrieval")
    cfg = TreeConfig(mode="adaptive", budget=8, root_k=4, top_k=2, mu=0.1, max_depth=4)
    tree = build_tree(tree, synthetic(0.6), cfg, 8)
    assert tree.sources[r1] == "both"
    assert tree.num_draft == 8
    assert tree.sources.count("retrieval") == 1


def test_min_conf_stops_drafting_when_the_best_guess_is_unlikely() -> None:
    cfg = TreeConfig(mode="adaptive", budget=40, root_k=4, top_k=2, mu=0.1, max_depth=10, min_conf=0.5)
    expand = synthetic(0.8)
    tree = build_tree(DraftTree.with_root(3), expand, cfg, 40)
    # best path conf per layer: 0.8, 0.64, 0.512, 0.41 -> layers 1..3 are expanded, layer 4 is not
    assert len(expand.calls) == 4 and max(tree.depths) == 4
    chain = TreeConfig(mode="chain", budget=10, max_depth=10, min_conf=0.5)
    assert build_tree(DraftTree.with_root(3), synthetic(0.8), chain, 10).num_draft == 4
