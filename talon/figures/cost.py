"""The cost view: why a step paid off on this hardware, or did not.

Left, the measured cost model a run ends with (``RunSummary.cost_model``, ``talon-cost/1``):
verification time against tree size and draft time per layer against frontier width, with every
step of the run placed on the verify curve. Right, for the chosen step, the expected tokens per
second had its tree been cut to n nodes, best first by the planner's acceptance estimates:
(expected accepted + 1) / (the step's draft time + verify(n + 1) + other). The tree it verified
is marked, so a person sees where the goodput peaks and what a bigger budget would cost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from talon.cost.curve import CURVE_SIZES, Curve, check_times
from talon.figures.common import (
    PATH_COLOR,
    SOURCE_COLORS,
    Trace,
    axis_style,
    base_layout,
    empty_figure,
    make_figure,
)
from talon.trace import StepTrace

VERIFY_COLOR, DRAFT_COLOR, RATE_COLOR = SOURCE_COLORS["bonus"], SOURCE_COLORS["model"], "#D55E00"


def curves(cost_model: Mapping[str, Any]) -> tuple[Curve, Curve | None, float]:
    """The verify and draft curves and the per-step overhead of a ``talon-cost/1`` dict."""
    if list(cost_model.get("grid", [])) != list(CURVE_SIZES):
        raise ValueError("not a talon-cost/1 model on this grid")
    draft = cost_model.get("draft_s")
    check_times(cost_model.get("verify_s"), "verify_s")
    if draft:
        check_times(draft, "draft_s")
    return (
        Curve([float(v) for v in cost_model["verify_s"]]),
        Curve([float(v) for v in draft]) if draft else None,
        float(cost_model.get("other_s", 0.0)),
    )


def expected_rate(step: StepTrace, verify: Curve, other_s: float) -> tuple[list[int], list[float]]:
    """Tree sizes 0..N and the expected tokens/s of the step's best n nodes at each size."""
    probs = sorted(step.p_accept_est[1:], reverse=True)
    sizes, rates, expected = [0], [1.0 / (step.draft_s + verify(1) + other_s)], 0.0
    for n, p in enumerate(probs, 1):
        expected += p
        sizes.append(n)
        rates.append((expected + 1.0) / (step.draft_s + verify(n + 1) + other_s))
    return sizes, rates


def cost_figure(cost_model: Mapping[str, Any] | None, steps: Sequence[StepTrace],
                selected: int | None = None) -> go.Figure:
    """Measured cost curves with the run's steps on them, and the chosen step's goodput by size."""
    if not cost_model:
        return empty_figure("The cost model appears when a cost-aware run ends (or in its replayed trace).")
    try:
        verify, draft, other_s = curves(cost_model)
    except (KeyError, TypeError, ValueError):
        return empty_figure("This trace's cost model cannot be read.")
    biggest = max([len(st.tokens) for st in steps] + [32])
    sizes = [g for g in CURVE_SIZES if g <= max(64, 2 * biggest)]
    traces: list[Trace] = [
        dict(type="scatter", x=sizes, y=[1e3 * verify(s) for s in sizes], mode="lines+markers",
             name="verify (tree nodes)",
             line=dict(color=VERIFY_COLOR, width=2), hovertemplate="verify %{x} nodes: %{y:.0f} ms<extra></extra>"),
    ]
    if draft is not None:
        widths = [g for g in CURVE_SIZES if g <= 32]
        traces.append(dict(type="scatter", x=widths, y=[1e3 * draft(w) for w in widths], mode="lines+markers",
                           name="one draft layer (frontier width)", line=dict(color=DRAFT_COLOR, width=2, dash="dot"),
                           hovertemplate="draft layer of %{x}: %{y:.0f} ms<extra></extra>"))
    if steps:
        traces.append(dict(type="scatter", x=[len(st.tokens) for st in steps], y=[1e3 * st.verify_s for st in steps],
                           mode="markers", name="this run's steps (measured)", text=[st.step for st in steps],
                           marker=dict(color=VERIFY_COLOR, size=7, opacity=0.45),
                           hovertemplate="step %{text}: %{x} nodes, %{y:.0f} ms<extra></extra>"))
    chosen = steps[selected] if steps and selected is not None and 0 <= selected < len(steps) else None
    if chosen is not None:
        traces.append(dict(type="scatter", x=[len(chosen.tokens)], y=[1e3 * chosen.verify_s], mode="markers",
                           name=f"step {chosen.step}", marker=dict(color=PATH_COLOR, size=13, symbol="circle-open",
                                                                   line=dict(width=3)), hoverinfo="skip"))
        traces += _rate_traces(chosen, verify, other_s)
    packed = (cost_model.get("provenance") or {}).get("weights")
    layout = base_layout(
        "Cost model on this hardware" + (f" · target {packed}" if packed else "")
        + (f" · step {chosen.step}" if chosen is not None else ""),
        440,
        xaxis=axis_style("nodes (verify) · width (draft)", domain=[0, 0.44]),
        yaxis=axis_style("ms", rangemode="tozero"),
        xaxis2=axis_style("draft nodes kept, best first", domain=[0.58, 1], anchor="y2"),
        yaxis2=axis_style("expected tokens/s", anchor="x2", rangemode="tozero"),
        legend=dict(orientation="h", y=-0.3, yanchor="top", x=0, font=dict(size=11)),
        margin=dict(l=50, r=20, t=70, b=150),
    )
    return make_figure(traces, layout)


def _rate_traces(step: StepTrace, verify: Curve, other_s: float) -> list[Trace]:
    if len(step.p_accept_est) != len(step.tokens):
        return []
    sizes, rates = expected_rate(step, verify, other_s)
    kept = len(step.tokens) - 1
    best = max(range(len(rates)), key=rates.__getitem__)
    return [
        dict(type="scatter", x=sizes, y=rates, mode="lines", name="expected tok/s if cut to n nodes",
             xaxis="x2", yaxis="y2", line=dict(color=RATE_COLOR, width=2),
             hovertemplate="%{x} nodes: %{y:.2f} tok/s expected<extra></extra>"),
        dict(type="scatter", x=[kept], y=[rates[kept]], mode="markers", name=f"verified: {kept} nodes",
             xaxis="x2", yaxis="y2", marker=dict(color=PATH_COLOR, size=12, symbol="diamond"),
             hovertemplate="the tree verified: %{x} nodes, %{y:.2f} tok/s expected<extra></extra>"),
        dict(type="scatter", x=[sizes[best]], y=[rates[best]], mode="markers", name=f"best: {sizes[best]} nodes",
             xaxis="x2", yaxis="y2", marker=dict(color=RATE_COLOR, size=12, symbol="star"),
             hovertemplate="goodput peaks at %{x} nodes: %{y:.2f} tok/s<extra></extra>"),
    ]
