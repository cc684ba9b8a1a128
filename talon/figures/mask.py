"""The tree attention mask of one verification forward: which node sees which."""

from __future__ import annotations

import plotly.graph_objects as go

from talon.figures.common import (
    MAX_MASK_HOVER,
    MAX_NODE_LABELS,
    Trace,
    axis_style,
    base_layout,
    make_figure,
)
from talon.figures.text import token_label
from talon.trace import StepTrace
from talon.tree import ancestor_rows

# (3) Tree attention mask
# ---------------------------------------------------------------------------------------------


def mask_figure(step: StepTrace) -> go.Figure:
    """The tree attention mask of the verification forward: row = query node, column = key node;
    a node attends to itself and its ancestors (and to the whole committed prefix, not drawn)."""
    n = len(step.tokens)
    on_path = set(step.accepted)
    mask = ancestor_rows(step.parents)
    z = [[(2 if i in on_path else 1) if mask[i][j] else 0 for j in range(n)] for i in range(n)]
    heat: Trace = dict(
        type="heatmap",
        z=z,
        x=list(range(n)),
        y=list(range(n)),
        zmin=0,
        zmax=2,
        colorscale=[
            [0, "#f2f2f2"],
            [0.33, "#f2f2f2"],
            [0.34, "#8ab6d6"],
            [0.66, "#8ab6d6"],
            [0.67, "#1b4f72"],
            [1, "#1b4f72"],
        ],
        showscale=False,
        xgap=1,
        ygap=1,
    )
    if n <= MAX_MASK_HOVER:
        heat.update(
            hovertext=[[_mask_hover(step, i, j, mask[i][j]) for j in range(n)] for i in range(n)], hoverinfo="text"
        )
    else:
        heat.update(hovertemplate="query node %{y} → key node %{x}<extra></extra>")
    ticks = dict(
        tickmode="array",
        tickvals=list(range(n)),
        ticktext=[f"{i}:{token_label(step.texts[i], 8)}" for i in range(n)],
        showticklabels=n <= MAX_NODE_LABELS,
        tickfont=dict(size=9),
        showgrid=False,
    )
    rows = dict(ticks, ticktext=[mask_row_label(step, i) for i in range(n)])
    layout = base_layout(
        f"Tree attention mask, step {step.step} ({n}×{n})",
        max(320, min(760, 16 * n + 160)),
        xaxis=axis_style("key node (attended to)", **ticks),
        yaxis=axis_style("query node @ position id", autorange="reversed", scaleanchor="x", **rows),
    )
    return make_figure([heat], layout)


def mask_row_label(step: StepTrace, node: int) -> str:
    """'3:tok @412': node id, token and position id (siblings share a position: they are
    alternatives for the same place in the text, told apart only by the mask)."""
    label = f"{node}:{token_label(step.texts[node], 8)}"
    return f"{label} @{step.positions[node]}" if node < len(step.positions) else label


def _mask_hover(step: StepTrace, i: int, j: int, visible: bool) -> str:
    verb = "attends to" if visible else "cannot see"
    text = f"node {i} {token_label(step.texts[i], 12)} {verb} node {j} {token_label(step.texts[j], 12)}"
    if i < len(step.positions):
        text += f"<br>positions: query {step.positions[i]}, key {step.positions[j]}"
    return text


# ---------------------------------------------------------------------------------------------
