"""DraftTree: masks, positions and paths derived from parent pointers."""

import pytest
import torch

from talon.core.forward import tree_mask, tree_positions
from talon.tree import DraftTree, ancestor_rows, layer_width


def hand_tree() -> DraftTree:
    #        0
    #      /   \
    #     1     2
    #    / \     \
    #   3   4     5
    #   |
    #   6
    t = DraftTree.with_root(100)
    a = t.add(0, 11, 0.6, "model")
    b = t.add(0, 12, 0.3, "retrieval")
    c = t.add(a, 13, 0.5, "model")
    t.add(a, 14, 0.4, "both")
    t.add(b, 15, 1.0, "retrieval")
    t.add(c, 16, 0.9, "model")
    return t


def test_depths_positions_paths():
    t = hand_tree()
    assert t.depths == [0, 1, 1, 2, 2, 2, 3]
    assert tree_positions(t, 10).tolist() == [10, 11, 11, 12, 12, 12, 13]
    assert t.path(6) == [0, 1, 3, 6]
    assert sorted(t.path(leaf) for leaf in t.leaves()) == [[0, 1, 3, 6], [0, 1, 4], [0, 2, 5]]
    assert t.leaves() == [4, 5, 6]
    assert t.num_draft == 6 and max(t.depths) == 3 and layer_width(t.depths) == 3


def test_ancestor_mask():
    m = tree_mask(hand_tree())
    expected = torch.zeros(7, 7, dtype=torch.bool)
    ancestry = {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 1, 3], 4: [0, 1, 4], 5: [0, 2, 5], 6: [0, 1, 3, 6]}
    for node, ancestors in ancestry.items():
        expected[node, ancestors] = True
    assert torch.equal(m, expected)


def test_path_conf_is_product_of_q():
    t = hand_tree()
    assert abs(t.path_conf[6] - 0.6 * 0.5 * 0.9) < 1e-12
    assert t.child_with_token(1, 14) == 4 and t.child_with_token(1, 99) is None


def test_parent_must_precede_child_and_the_source_be_known():
    t = DraftTree.with_root(1)
    with pytest.raises(ValueError, match="parent 3 must be a node"):
        t.add(3, 5, 0.5, "model")
    with pytest.raises(ValueError, match="source must be one of"):
        t.add(0, 5, 0.5, "oracle")
    assert len(t.tokens) == 1  # nothing was added


def test_one_shape_helper_serves_tree_trace_and_figures():
    t = hand_tree()
    assert ancestor_rows(t.parents) == tree_mask(t).tolist()
    assert layer_width([0]) == 0 and layer_width([0, 1, 1, 2]) == 2
