"""Plotly figures of a benchmark report: speedup, time split, sweep heatmaps."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from talon.bench.options import ALL_SUITES_ROW
from talon.bench.results import TIME_PARTS, ResultRow, fmt, methods_of


def speedup_figure(rows: Sequence[ResultRow]) -> go.Figure:
    """Grouped bars: speedup vs ar per suite, one bar per method."""
    fig = go.Figure()
    for method in methods_of(rows):
        mine = [r for r in rows if r.method == method]
        fig.add_bar(
            name=method,
            x=[r.suite for r in mine],
            y=[r.speedup_vs_ar for r in mine],
            customdata=[[fmt(r.mat, ".2f"), r.tokens_per_second, r.settings.get("variant", "")] for r in mine],
            hovertemplate=f"{method} %{{x}}: %{{y:.2f}}x<br>MAT %{{customdata[0]}}, %{{customdata[1]:.1f}} tok/s"
            "<br>%{customdata[2]}<extra></extra>",
        )
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    fig.update_layout(barmode="group", title="Speedup over autoregressive decoding", yaxis_title="speedup vs ar")
    return fig


def time_split_figure(rows: Sequence[ResultRow]) -> go.Figure:
    """Stacked bars: seconds per part, per Talon method, over all suites."""
    split = [r for r in rows if r.suite == ALL_SUITES_ROW and r.draft_s is not None]
    fig = go.Figure()
    for part, meaning in TIME_PARTS.items():
        fig.add_bar(
            name=part.removesuffix("_s"), x=[r.method for r in split], y=[getattr(r, part) for r in split],
            hovertext=meaning,
        )
    fig.update_layout(barmode="stack", title="Where the time goes (all suites)", yaxis_title="seconds")
    return fig


def sweep_figure(rows: Sequence[ResultRow]) -> go.Figure:
    """Heatmaps over (mu, N), all suites: MAT left, speedup right, one row per root_k."""
    all_rows = [r for r in rows if r.suite == ALL_SUITES_ROW]
    ks = sorted({r.root_k for r in all_rows})
    mus = sorted({r.mu for r in all_rows})
    budgets = sorted({r.budget for r in all_rows})
    cell = {(r.root_k, r.mu, r.budget): r for r in all_rows}
    titles = [f"{metric}, K={k}" for k in ks for metric in ("MAT", "speedup vs ar")]
    fig = make_subplots(rows=len(ks), cols=2, subplot_titles=titles)
    for i, k in enumerate(ks, 1):
        for j, (attr, scale) in enumerate((("mat", "Blues"), ("speedup_vs_ar", "Viridis")), 1):
            z = [[getattr(cell[(k, mu, n)], attr) for n in budgets] for mu in mus]  # (mu, N)
            fig.add_trace(
                go.Heatmap(
                    z=z, x=[str(n) for n in budgets], y=[f"{mu:g}" for mu in mus], colorscale=scale,
                    texttemplate="%{z:.2f}", showscale=False,
                    hovertemplate="N=%{x}, mu=%{y}: %{z:.2f}<extra></extra>",
                ),
                row=i, col=j,
            )
            fig.update_xaxes(title_text="budget N", row=i, col=j)
            fig.update_yaxes(title_text="mu", row=i, col=j)
    fig.update_layout(title=f"Sweep: {all_rows[0].method} (all suites)", height=420 * len(ks))
    return fig
