"""The other per-step figures: the confidence gates, the tree attention mask and the
drafter / verifier timeline up to the selected step."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from talon.figures.common import (
    GATED_COLOR,
    MAX_MASK_HOVER,
    MAX_NODE_LABELS,
    PASS_COLOR,
    PATH_COLOR,
    SOURCE_COLORS,
    Trace,
    axis_style,
    base_layout,
    empty_figure,
    legend_top,
    make_figure,
)
from talon.figures.text import fmt_number, token_label
from talon.shape import ancestor_rows
from talon.trace import StepTrace

# ---------------------------------------------------------------------------------------------
# (2) Confidence gates
# ---------------------------------------------------------------------------------------------


def _spread(count: int, width: float = 0.56) -> list[float]:
    """Horizontal offsets that spread ``count`` points of one layer around its depth."""
    if count <= 1:
        return [0.0] * count
    return [-width / 2 + width * i / (count - 1) for i in range(count)]


THRESHOLD_LINES = (("threshold (μ × max)", "dash", GATED_COLOR), ("layer max", "dot", "#888"))


def gate_figure(step: StepTrace) -> go.Figure:
    """Per layer, each candidate's path confidence (log scale) against the layer's threshold
    (mu x the layer's best confidence, for the adaptive tree): above it expands, below it not."""
    gated = [i for i, p in enumerate(step.gate_passed) if p is not None]
    if not gated:
        return empty_figure(
            f"Step {step.step}: no confidence gate in this tree (chain, retrieval only, or root layer only)."
        )
    traces: list[Trace] = []
    xs: dict[int, float] = {}
    for depth in sorted({step.depths[i] for i in gated}):
        layer = sorted((i for i in gated if step.depths[i] == depth), key=lambda i: -step.path_conf[i])
        xs.update({i: depth + dx for i, dx in zip(layer, _spread(len(layer)))})
        traces += _threshold_traces(step, layer[0], depth)
    traces += [
        dict(type="scatter", x=[None], y=[None], mode="lines", name=name, line=dict(color=color, dash=dash, width=2))
        for name, dash, color in THRESHOLD_LINES
    ]
    for passed, name, color, symbol in (
        (True, "expanded (c ≥ threshold)", PASS_COLOR, "circle"),
        (False, "gated out (c < threshold)", GATED_COLOR, "x"),
    ):
        nodes = [i for i in gated if step.gate_passed[i] is passed]
        traces.append(
            dict(
                type="scatter",
                x=[xs[i] for i in nodes],
                y=[max(step.path_conf[i], 1e-12) for i in nodes],
                mode="markers",
                name=name,
                marker=dict(color=color, size=11, symbol=symbol, line=dict(color="white", width=1)),
                hovertext=[_gate_hover(step, i) for i in nodes],
                hoverinfo="text",
            )
        )
    layout = base_layout(
        f"Confidence gates, step {step.step}",
        340,
        xaxis=axis_style("layer (depth)", dtick=1),
        yaxis=axis_style("path confidence c (log)", type="log", exponentformat="power"),
        legend=legend_top(),
    )
    return make_figure(traces, layout)


def _threshold_traces(step: StepTrace, node: int, depth: int) -> list[Trace]:
    """Short horizontal segments at one layer's threshold and best confidence."""
    values = (step.gate_threshold[node], step.gate_layer_max[node])
    return [
        dict(
            type="scatter",
            x=[depth - 0.38, depth + 0.38],
            y=[value, value],
            mode="lines",
            line=dict(color=color, dash=dash, width=2),
            showlegend=False,
            hovertext=[f"layer {depth}: {name} = {fmt_number(value)}"] * 2,
            hoverinfo="text",
        )
        for value, (name, dash, color) in zip(values, THRESHOLD_LINES)
        if value is not None and value > 0
    ]


def _gate_hover(step: StepTrace, node: int) -> str:
    passed = step.gate_passed[node]
    return (
        f"<b>{token_label(step.texts[node])}</b> (node {node}, depth {step.depths[node]})<br>"
        f"c = {fmt_number(step.path_conf[node])}<br>"
        f"layer max = {fmt_number(step.gate_layer_max[node])} · threshold = {fmt_number(step.gate_threshold[node])}<br>"
        + ("expanded: proposes children" if passed else "gated out: too unsure to expand")
    )


# ---------------------------------------------------------------------------------------------
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
# (4) Async timeline
# ---------------------------------------------------------------------------------------------


def timeline_figure(steps: Sequence[StepTrace], selected: int | None = None, window: int = 10) -> go.Figure:
    """Drafter and verifier busy intervals of the last ``window`` steps up to ``selected``.
    Synchronous decoding alternates the two rows; asynchronous drafting overlaps them."""
    if not steps:
        return empty_figure("No steps yet.")
    end = len(steps) - 1 if selected is None else max(0, min(selected, len(steps) - 1))
    shown = steps[max(0, end - window + 1) : end + 1]
    current = steps[end].step
    traces = [
        _lane_trace(lane, [(st, a, b) for st in shown for a, b in getattr(st, attr)], color, current)
        for lane, attr, color in (
            ("drafter", "drafter_busy", SOURCE_COLORS["model"]),
            ("verifier", "verifier_busy", SOURCE_COLORS["bonus"]),
        )
    ]
    layout = base_layout(
        f"Drafter / verifier timeline, steps {shown[0].step}–{shown[-1].step}",
        250,
        barmode="overlay",
        showlegend=False,
        margin=dict(l=70, r=20, t=50, b=40),
        xaxis=axis_style("ms since the run started"),
        yaxis=axis_style(categoryorder="array", categoryarray=["verifier", "drafter"]),
    )
    return make_figure(traces, layout)


def _lane_trace(lane: str, bars: list[tuple[StepTrace, float, float]], color: str, current: int) -> Trace:
    now = [st.step == current for st, _, _ in bars]
    return dict(
        type="bar",
        orientation="h",
        name=lane,
        x=[(b - a) * 1e3 for _, a, b in bars],
        base=[a * 1e3 for _, a, _ in bars],
        y=[lane] * len(bars),
        marker=dict(
            color=color,
            opacity=[1.0 if c else 0.5 for c in now],
            line=dict(color=PATH_COLOR, width=[2 if c else 0 for c in now]),
        ),
        text=[f"s{st.step}" for st, _, _ in bars],
        textposition="inside",
        hovertext=[_interval_hover(lane, st, a, b) for st, a, b in bars],
        hoverinfo="text",
    )


def _interval_hover(lane: str, st: StepTrace, start: float, end: float) -> str:
    reuse = {True: "<br>pre-drafted tree reused", False: "<br>pre-drafted tree discarded", None: ""}[st.predraft_reused]
    return (
        f"step {st.step} · {lane} busy<br>{start * 1e3:.1f} → {end * 1e3:.1f} ms ({(end - start) * 1e3:.1f} ms){reuse}"
    )
