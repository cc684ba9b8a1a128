"""The confidence gates of one step: each layer's best path confidence, the threshold mu x max,
and which nodes passed (expanded) or were gated out."""

from __future__ import annotations

import plotly.graph_objects as go

from talon.figures.common import (
    GATED_COLOR,
    PASS_COLOR,
    Trace,
    axis_style,
    base_layout,
    empty_figure,
    legend_top,
    make_figure,
)
from talon.figures.text import fmt_number, token_label
from talon.trace import StepTrace

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
