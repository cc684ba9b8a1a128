"""Figures over several runs: Compare (runs side by side) and the threshold explorer's
mu x N heatmaps of sweep results (``MeasuredCell``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from talon.figures.common import (
    GATED_COLOR,
    SOURCE_COLORS,
    Trace,
    axis_style,
    base_layout,
    empty_figure,
    legend_top,
    make_figure,
)
from talon.figures.run import step_end_times
from talon.figures.text import esc
from talon.trace import StepTrace


def compare_figure(runs: Sequence[tuple[str, Sequence[StepTrace]]]) -> go.Figure:
    """Runs side by side: tokens committed per step (left), committed tokens over time (right)."""
    traces: list[Trace] = []
    for (label, steps), color in zip(runs, (SOURCE_COLORS["model"], GATED_COLOR, SOURCE_COLORS["bonus"])):
        counts = [len(st.new_tokens) for st in steps]
        cumulative = [sum(counts[: i + 1]) for i in range(len(counts))]
        name = esc(label)
        traces.append(
            dict(
                type="scatter",
                x=[st.step for st in steps],
                y=counts,
                mode="lines+markers",
                name=name,
                legendgroup=name,
                line=dict(color=color),
            )
        )
        traces.append(
            dict(
                type="scatter",
                x=step_end_times(steps),
                y=cumulative,
                mode="lines",
                name=name,
                legendgroup=name,
                showlegend=False,
                line=dict(color=color, width=3),
                xaxis="x2",
                yaxis="y2",
            )
        )
    layout = base_layout(
        "Compare: tokens per step (left) and committed tokens over time (right)",
        330,
        xaxis=axis_style("step", domain=[0, 0.45]),
        yaxis=axis_style("tokens per step", rangemode="tozero"),
        xaxis2=axis_style("seconds", domain=[0.55, 1], anchor="y2"),
        yaxis2=axis_style("committed tokens", rangemode="tozero", anchor="x2"),
        legend=legend_top(),
    )
    return make_figure(traces, layout)


# ---------------------------------------------------------------------------------------------
# Threshold explorer: mu x N heatmaps
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MeasuredCell:
    """One (mu, budget) measurement of a sweep; a metric is None where it was not measured."""

    suite: str
    method: str
    mu: float
    budget: int
    mat: float | None
    tokens_per_second: float | None
    speedup_vs_ar: float | None = None


SWEEP_METRICS: dict[str, tuple[str, str]] = {  # metric -> (title, colour-bar label)
    "mat": ("MAT (tokens per target forward)", "MAT"),
    "tokens_per_second": ("tokens per second", "tok/s"),
    "speedup_vs_ar": ("speedup vs autoregressive", "×AR"),
}


def sweep_grid(rows: Sequence[MeasuredCell], metric: str) -> tuple[list[float], list[int], list[list[float | None]]]:
    """(mus, budgets, z[mu][budget]): the mean of ``metric`` per cell, None where unmeasured."""
    cells: dict[tuple[float, int], list[float]] = {}
    for row in rows:
        value = getattr(row, metric)
        if value is not None and math.isfinite(value):
            cells.setdefault((row.mu, row.budget), []).append(value)
    mus = sorted({r.mu for r in rows})
    budgets = sorted({r.budget for r in rows})
    z = [[_mean(cells.get((m, b))) for b in budgets] for m in mus]
    return mus, budgets, z


def _mean(values: list[float] | None) -> float | None:
    return sum(values) / len(values) if values else None


def sweep_heatmap(rows: Sequence[MeasuredCell], metric: str, title: str = "") -> go.Figure:
    """A mu (rows) x budget N (columns) heatmap of one metric, every cell labelled."""
    if not rows:
        return empty_figure("No sweep results yet: run a sweep or load a results.json.")
    mus, budgets, z = sweep_grid(rows, metric)
    label, short = SWEEP_METRICS.get(metric, (metric, metric))
    heat: Trace = dict(
        type="heatmap",
        z=z,
        x=[str(b) for b in budgets],
        y=[f"{m:g}" for m in mus],
        text=[["" if v is None else f"{v:.2f}" for v in row] for row in z],
        texttemplate="%{text}",
        colorscale="Viridis",
        colorbar=dict(title=dict(text=esc(short)), thickness=14),
        hovertemplate="μ = %{y}, N = %{x}<br>" + esc(label) + " = %{z:.3f}<extra></extra>",
    )
    layout = base_layout(
        title or label,
        max(280, 48 * len(mus) + 150),
        xaxis=axis_style("budget N", type="category"),
        yaxis=axis_style("gate μ", type="category"),
    )
    return make_figure([heat], layout)
