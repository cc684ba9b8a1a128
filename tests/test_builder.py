"""Tree builders on synthetic drafters: budget, order, shape and recorded gates."""

from __future__ import annotations

import math

import pytest

from talon.core.builder import build_tree
from talon.cost.plan import CalibratedAcceptance
from talon.run_config import TreeConfig
from talon.tree import DraftTree, layer_width
from tests.tiny import synthetic


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


# --- admission by calibrated acceptance ------------------------------------------------------

FAVOURED, SHUNNED = 0.3, 0.6  # the drafter's q for the child the target takes / refuses


def two_children(tree: DraftTree, nodes: list[int], k: int):
    """Every node proposes the same two children: q = 0.6 first, then q = 0.3."""
    return [[((tree.tokens[n] * 3 + 1) % 250, SHUNNED), ((tree.tokens[n] * 3 + 2) % 250, FAVOURED)][:k]
            for n in nodes]


def calibrated_model() -> CalibratedAcceptance:
    """A run's acceptance model after 40 steps in which the draft's 0.3-children were always
    accepted and its 0.6-children never: raw q ranks them the wrong way round."""
    model = CalibratedAcceptance()
    tree = DraftTree.with_root(0)
    shunned = tree.add(0, 1, SHUNNED, "model")
    favoured = tree.add(0, 2, FAVOURED, "model")
    for _ in range(40):
        model.observe(tree, [0, favoured], 0)
    assert model.p_cond("model", FAVOURED, 0) > 0.9 and model.p_cond("model", SHUNNED, 0) < 0.1
    assert tree.sources[shunned] == "model"
    return model


def build_both(cfg: TreeConfig) -> tuple[DraftTree, DraftTree, CalibratedAcceptance]:
    """The same tree built ranked by raw path confidence and by calibrated acceptance."""
    model = calibrated_model()
    raw = build_tree(DraftTree.with_root(3), two_children, cfg, cfg.budget)
    cal = build_tree(DraftTree.with_root(3), two_children, cfg, cfg.budget,
                     scores=lambda tree: model.node_probs(tree, 0))
    return raw, cal, model


def expected_accepted(model: CalibratedAcceptance, tree: DraftTree) -> float:
    return sum(model.node_probs(tree, 0)[1:])


def test_the_adaptive_fill_admits_by_calibrated_acceptance() -> None:
    """Ranked by calibrated P(accepted), the budget goes to the chain the target keeps taking
    (q = 0.3 all the way down); ranked by raw q, most of it goes to the 0.6-children it refuses."""
    cfg = TreeConfig(mode="adaptive", budget=8, root_k=2, top_k=2, mu=0.1, max_depth=10, min_conf=0.0)
    raw, cal, model = build_both(cfg)
    assert cal.num_draft == raw.num_draft == 8
    assert cal.parents == list(range(-1, 8)) and set(cal.q_draft[1:]) == {FAVOURED}
    assert sum(q == SHUNNED for q in raw.q_draft[1:]) >= 4
    assert expected_accepted(model, cal) > 2 * expected_accepted(model, raw)
    check_order(cal)


def favoured_path(tree: DraftTree, node: int) -> bool:
    return all(tree.q_draft[n] == FAVOURED for n in tree.path(node)[1:])


def test_the_static_baseline_expands_the_calibrated_best() -> None:
    """The static tree (EAGLE-2's shape) ranked the same way expands, at every layer, the node
    the target keeps taking (its path all 0.3-children), which raw q ranks last from layer 2 on,
    and keeps that chain in its best N."""
    cfg = TreeConfig(mode="static", budget=8, root_k=2, top_k=2, mu=0.1, max_depth=5, min_conf=0.0)
    raw, cal, model = build_both(cfg)
    for tree in (raw, cal):
        check_order(tree)
        assert tree.num_draft == cfg.budget
    chain = [n for n in range(1, len(cal)) if favoured_path(cal, n)]
    assert [cal.depths[n] for n in chain] == list(range(1, cfg.max_depth + 1))
    assert all(cal.gates[n].passed for n in chain if cal.depths[n] < cfg.max_depth)
    raw_chain = [n for n in range(1, len(raw)) if favoured_path(raw, n)]
    assert max(raw.depths[n] for n in raw_chain) <= 2  # raw q never expands it past layer 1
    assert expected_accepted(model, cal) > 2 * expected_accepted(model, raw)


def test_the_gates_stay_limits_under_calibrated_admission() -> None:
    """A favoured node that fails TALON's gate (c < mu x the layer's best c) is not expanded,
    however likely the acceptance model finds it."""
    cfg = TreeConfig(mode="adaptive", budget=8, root_k=2, top_k=2, mu=0.9, max_depth=10, min_conf=0.0)
    _, cal, _ = build_both(cfg)
    for n in range(1, len(cal)):
        if cal.q_draft[n] == FAVOURED and cal.depths[n] == 1:
            assert cal.gates[n] is not None and not cal.gates[n].passed
            assert not cal.children(n)
    assert max(cal.depths) >= 2  # the 0.6-chain passes the gate and grows
