"""Tree shape from plain lists (no torch): shared by the tree itself, the traces and the figures,
so that a width or an ancestor relation is computed one way everywhere."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def layer_width(depths: Sequence[int]) -> int:
    """Largest number of nodes on one layer, the root's layer (depth 0) excluded."""
    return max(Counter(d for d in depths if d > 0).values(), default=0)


def ancestor_rows(parents: Sequence[int]) -> list[list[bool]]:
    """(T, T) bool as nested lists: row i is True at i and at every ancestor of i. Parents come
    before children (``parents[i] < i``), so each row extends its parent's."""
    rows: list[list[bool]] = []
    for node, parent in enumerate(parents):
        row = list(rows[parent]) if parent >= 0 else [False] * len(parents)
        row[node] = True
        rows.append(row)
    return rows
