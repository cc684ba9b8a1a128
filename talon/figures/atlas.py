"""The atlas explorer's figures: replayed configurations (``talon.atlas.sweep.SweepRow``) as
heatmaps over two knobs, a Pareto chart of MAT against predicted step time, and the score of
one configuration as HTML. Pure functions of the rows: no model, no Gradio, no replay."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

from talon.figures.common import (
    GATED_COLOR,
    PASS_COLOR,
    PATH_COLOR,
    Trace,
    axis_style,
    base_layout,
    empty_figure,
    legend_top,
    make_figure,
)
from talon.figures.text import esc

if TYPE_CHECKING:
    from talon.atlas.result import ReplayResult
    from talon.atlas.sweep import SweepRow

ATLAS_METRICS: dict[str, tuple[str, str]] = {  # SweepRow attribute -> (title, colour-bar label)
    "mat": ("MAT (tokens per target forward)", "MAT"),
    "tokens_per_s": ("predicted tokens per second", "tok/s"),
}
KNOB_NAMES: dict[str, str] = {  # grid key (talon generate's flag) -> what the explorer calls it
    "drafter": "drafter",
    "tree": "tree",
    "budget": "budget N",
    "root_k": "root K",
    "top_k": "k",
    "mu": "gate μ",
    "max_depth": "max depth",
    "min_conf": "min conf",
    "retrieval_min_match": "min match",
    "graft_threshold": "graft threshold",
    "cost_aware": "cost-aware",
}
BEST_COLOR = "#D55E00"


def knob_text(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def config_words(values: dict[str, Any]) -> str:
    """A configuration in words: 'drafter hybrid · tree adaptive · budget N 16 · ...'."""
    return " · ".join(f"{KNOB_NAMES.get(k, k)} {knob_text(v)}" for k, v in values.items())


def _cell(value: float, metric: str) -> str:
    return f"{value:.2f}" if metric == "mat" else f"{value:.1f}"


# ---------------------------------------------------------------------------------------------
# Heatmaps over two knobs
# ---------------------------------------------------------------------------------------------


def atlas_grid(
    rows: Sequence[SweepRow], x_key: str, y_key: str, metric: str
) -> tuple[list[Any], list[Any], list[list[SweepRow | None]]]:
    """(xs, ys, cells[y][x]): the row of every (x, y) pair of knob values, None where absent."""
    xs = sorted({r.values[x_key] for r in rows})
    ys = sorted({r.values[y_key] for r in rows})
    by_cell = {(r.values[x_key], r.values[y_key]): r for r in rows}
    return xs, ys, [[by_cell.get((x, y)) for x in xs] for y in ys]


def _marker(x: Any, y: Any, name: str, symbol: str, color: str, size: int) -> Trace:
    return dict(type="scatter", x=[knob_text(x)], y=[knob_text(y)], mode="markers", name=name,
                marker=dict(symbol=symbol, size=size, color=color, line=dict(color=color, width=3)),
                hoverinfo="skip", showlegend=True)


def atlas_heatmap(
    rows: Sequence[SweepRow], x_key: str, y_key: str, metric: str,
    best: SweepRow | None = None, current: SweepRow | None = None, title: str = "",
) -> go.Figure:
    """``metric`` of every replayed configuration over two knobs (y rows, x columns), every cell
    labelled ('*': the atlas did not hold everything the configuration asked for); the sliders'
    configuration outlined and the best by predicted tokens/s starred, when they are in the grid."""
    if not rows:
        return empty_figure("Record or load an atlas: every cell is then a replay, in milliseconds.")
    xs, ys, cells = atlas_grid(rows, x_key, y_key, metric)
    z = [[getattr(r, metric) if r is not None else None for r in line] for line in cells]
    text = [["" if r is None else _cell(getattr(r, metric), metric) + ("" if r.exact else "*") for r in line]
            for line in cells]
    hover = [["" if r is None else f"{esc(config_words(r.values))}<br>MAT {r.mat:.3f} · {r.tokens_per_s:.1f} tok/s"
              f" · step {1000 * r.step_s:.1f} ms · coverage {100 * r.coverage:.0f} %" for r in line] for line in cells]
    label, short = ATLAS_METRICS[metric]
    x_name, y_name = KNOB_NAMES.get(x_key, x_key), KNOB_NAMES.get(y_key, y_key)
    traces: list[Trace] = [dict(
        type="heatmap", z=z, x=[knob_text(x) for x in xs], y=[knob_text(y) for y in ys], text=text,
        texttemplate="%{text}", customdata=hover, hovertemplate="%{customdata}<extra></extra>",
        colorscale="Viridis", colorbar=dict(title=dict(text=esc(short)), thickness=14), showscale=True,
    )]
    if current is not None and _in_grid(current, cells):
        traces.append(_marker(current.values[x_key], current.values[y_key], "sliders", "square-open", PATH_COLOR, 30))
    if best is not None and _in_grid(best, cells):
        traces.append(_marker(best.values[x_key], best.values[y_key], "best ★", "star", BEST_COLOR, 18))
    layout = base_layout(
        title or f"{label}: {y_name} × {x_name}", max(300, 44 * len(ys) + 170),
        xaxis=axis_style(x_name, type="category"), yaxis=axis_style(y_name, type="category"),
        legend=legend_top(),
    )
    return make_figure(traces, layout)


def _in_grid(row: SweepRow, cells: list[list[SweepRow | None]]) -> bool:
    return any(r is not None and r.values == row.values for line in cells for r in line)


# ---------------------------------------------------------------------------------------------
# Pareto chart
# ---------------------------------------------------------------------------------------------


def pareto_figure(
    rows: Sequence[SweepRow], front: Sequence[SweepRow], best: SweepRow | None = None,
    current: SweepRow | None = None,
) -> go.Figure:
    """MAT against predicted step time for every replayed configuration; the Pareto front (no
    other configuration has a higher MAT at a lower step time) joined, the best by predicted
    tokens/s starred and the sliders' configuration ringed."""
    if not rows:
        return empty_figure("The Pareto chart appears once an atlas is recorded or loaded.")

    def points(subset: Sequence[SweepRow], **style: Any) -> Trace:
        return dict(type="scatter", x=[1000 * r.step_s for r in subset], y=[r.mat for r in subset],
                    hovertext=[f"{esc(config_words(r.values))}<br>MAT {r.mat:.3f} · step {1000 * r.step_s:.1f} ms"
                               f" · {r.tokens_per_s:.1f} tok/s" for r in subset],
                    hoverinfo="text", **style)

    ordered = sorted(front, key=lambda r: r.step_s)
    traces: list[Trace] = [
        points(rows, mode="markers", name="replayed configurations",
               marker=dict(size=8, color=PASS_COLOR, opacity=0.45)),
        points(ordered, mode="lines+markers", name="Pareto front",
               marker=dict(size=10, color=GATED_COLOR), line=dict(color=GATED_COLOR, width=2)),
    ]
    if current is not None:
        traces.append(points([current], mode="markers", name="sliders",
                             marker=dict(size=18, symbol="circle-open", color=PATH_COLOR, line=dict(width=2))))
    if best is not None:
        traces.append(points([best], mode="markers", name="best ★ (tokens/s)",
                             marker=dict(size=20, symbol="star", color=BEST_COLOR, line=dict(color="white", width=1))))
    layout = base_layout(
        "Pareto: MAT against predicted step time", 380,
        xaxis=axis_style("predicted step time (ms)"), yaxis=axis_style("MAT (tokens per target forward)"),
        legend=legend_top(),
    )
    return make_figure(traces, layout)


# ---------------------------------------------------------------------------------------------
# The sliders' score, in words
# ---------------------------------------------------------------------------------------------


def coverage_words(result: ReplayResult) -> str:
    """'coverage 100 %: exact' or what the configuration asked for that the atlas does not hold."""
    share = result.coverage.share
    if result.exact:
        return "coverage 100 %: every draft this configuration asks for is in the atlas, the replay is exact"
    return (f"coverage {math.floor(100 * share):.0f} %: this configuration asks for more than the atlas recorded "
            f"({result.coverage.misses} of {result.coverage.requests} draft expansions missing; first "
            f"{result.coverage.first_miss}); missing drafts count as proposing nothing, so MAT is a lower bound")


def best_words(best: SweepRow, current: SweepRow | None = None) -> str:
    """The best configuration in words: the knobs it changes from ``current`` (all, without one)."""
    head = f"★ best found: {best.tokens_per_s:.1f} tokens/s predicted, MAT {best.mat:.2f}"
    if current is None:
        return f"{head}, with {config_words(best.values)}"
    changed = {k: v for k, v in best.values.items() if current.values.get(k) != v}
    if not changed:
        return f"{head}: the knobs as they are (nothing around them predicts more tokens/s)"
    return f"{head}, with {config_words(changed)} (other knobs as they are)"


def atlas_score_html(
    result: ReplayResult | None, best: SweepRow | None = None, note: str = "", current: SweepRow | None = None
) -> str:
    """MAT, predicted tokens/s and step time, steps and coverage of the knobs' replay, and the
    best configuration found around them in words."""
    if result is None:
        return f'<div class="talon-summary">{esc(note) or "No atlas yet: record one or upload one."}</div>'
    s = result.summary
    step_ms = 1000 * s.seconds / s.steps if s.steps else 0.0
    cells = [("MAT", f"{result.mat:.2f}"), ("predicted tokens/s", f"{s.tokens_per_second:.1f}"),
             ("predicted step", f"{step_ms:.1f} ms"), ("steps", str(s.steps)),
             ("coverage", f"{math.floor(100 * result.coverage.share):.0f} %")]
    stats = "".join(f'<div class="stat"><div class="v">{esc(v)}</div><div class="k">{esc(k)}</div></div>'
                    for k, v in cells)
    lines = [f'<div class="talon-coverage{"" if result.exact else " miss"}">{esc(coverage_words(result))}</div>']
    if best is not None:
        lines.append(f'<div class="talon-best">{esc(best_words(best, current))}</div>')
    if note:
        lines.append(f'<div class="talon-status">{esc(note)}</div>')
    return f'<div class="talon-summary"><div class="stats">{stats}</div>{"".join(lines)}</div>'
