"""Run-level figures: tokens committed per step by source (with the running MAT), acceptance by
depth, the share of committed tokens by source, tokens per second."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from talon.figures.common import (
    GATED_COLOR,
    PATH_COLOR,
    SOURCE_COLORS,
    SOURCE_NAMES,
    Trace,
    axis_style,
    base_layout,
    committed_tokens,
    empty_figure,
    legend_top,
    make_figure,
)
from talon.trace import StepTrace

# ---------------------------------------------------------------------------------------------
# Run-level figures
# ---------------------------------------------------------------------------------------------

COMMIT_SOURCES = ("bonus", "resampled", "model", "head", "mtp", "retrieval", "both")
MODEL_SLOTS = ("model", "head", "mtp")  # who drafted a run's model nodes: one of them per run


def committed_sources(step: StepTrace) -> dict[str, int]:
    """How many of this step's committed tokens came from each source (bonus included)."""
    counts = dict.fromkeys(COMMIT_SOURCES, 0)
    for tok in committed_tokens(step):
        counts[tok.source] = counts.get(tok.source, 0) + 1
    return counts


def accepted_per_step_figure(steps: Sequence[StepTrace], selected: int | None = None) -> go.Figure:
    """Committed tokens per step stacked by source, with the running mean (MAT)."""
    if not steps:
        return empty_figure("No steps yet.")
    x = [st.step for st in steps]
    per_step = [committed_sources(st) for st in steps]
    slot = next((s for s in MODEL_SLOTS if any(c[s] for c in per_step)), "model")  # an EAGLE-3 head, MTP layer
    traces: list[Trace] = [
        dict(type="bar", x=x, y=[c[s] for c in per_step], name=SOURCE_NAMES[s], marker=dict(color=SOURCE_COLORS[s]))
        for s in COMMIT_SOURCES if s == slot or s not in MODEL_SLOTS
    ]
    totals = [sum(c.values()) for c in per_step]
    running = [sum(totals[: i + 1]) / (i + 1) for i in range(len(totals))]
    traces.append(
        dict(type="scatter", x=x, y=running, mode="lines", name="running MAT", line=dict(color=PATH_COLOR, width=2))
    )
    shapes = []
    if selected is not None and 0 <= selected < len(steps):
        shapes.append(
            dict(
                type="line",
                xref="x",
                yref="paper",
                x0=x[selected],
                x1=x[selected],
                y0=0,
                y1=1,
                line=dict(color=GATED_COLOR, width=2, dash="dot"),
            )
        )
    layout = base_layout(
        f"Tokens committed per step (MAT {running[-1]:.2f})",
        300,
        barmode="stack",
        xaxis=axis_style("step"),
        yaxis=axis_style("tokens", rangemode="tozero"),
        legend=legend_top(),
        shapes=shapes,
    )
    return make_figure(traces, layout)


def acceptance_by_depth(steps: Sequence[StepTrace]) -> list[tuple[int, int, int]]:
    """(depth d, steps whose tree reached depth d, steps whose accepted path reached depth d)."""
    deepest = max((max(st.depths) for st in steps), default=0)
    return [
        (d, sum(max(st.depths) >= d for st in steps), sum(st.accept_len >= d for st in steps))
        for d in range(1, deepest + 1)
    ]


def acceptance_by_depth_figure(steps: Sequence[StepTrace]) -> go.Figure:
    """Share of steps whose accepted path reaches each depth, among steps that drafted that deep."""
    rows = acceptance_by_depth(steps)
    if not rows:
        return empty_figure("No drafted tokens yet (autoregressive run, or no steps).")
    rates = [a / d if d else 0.0 for _, d, a in rows]
    bar: Trace = dict(
        type="bar",
        x=[d for d, _, _ in rows],
        y=rates,
        marker=dict(color=SOURCE_COLORS["model"]),
        text=[f"{r:.0%}" for r in rates],
        textposition="outside",
        hovertext=[f"depth {d}: accepted in {a} of {n} steps that drafted this deep" for d, n, a in rows],
        hoverinfo="text",
    )
    layout = base_layout(
        "Acceptance by depth",
        300,
        xaxis=axis_style("depth", dtick=1),
        yaxis=axis_style("accepted share", range=[0, 1.15], tickformat=".0%"),
    )
    return make_figure([bar], layout)


def source_share_figure(steps: Sequence[StepTrace]) -> go.Figure:
    """Which source produced the committed tokens (the bonus token is the target's own)."""
    totals = dict.fromkeys(COMMIT_SOURCES, 0)
    for st in steps:
        for source, count in committed_sources(st).items():
            totals[source] = totals.get(source, 0) + count
    keys = [s for s in COMMIT_SOURCES if totals[s]]
    if not keys:
        return empty_figure("No tokens yet.")
    pie: Trace = dict(
        type="pie",
        labels=[SOURCE_NAMES[s] for s in keys],
        values=[totals[s] for s in keys],
        marker=dict(colors=[SOURCE_COLORS[s] for s in keys]),
        hole=0.45,
        sort=False,
        textinfo="percent",
        hoverinfo="label+value+percent",
    )
    return make_figure([pie], base_layout("Committed tokens by source", 300))


def step_end_times(steps: Sequence[StepTrace]) -> list[float]:
    """Seconds since the run started at which each step finished (from the timeline when
    recorded, else from the sum of the phase timings)."""
    ends: list[float] = []
    clock = 0.0
    for st in steps:
        marks = [b for _, b in list(st.drafter_busy) + list(st.verifier_busy)]
        clock = max(marks) if marks else clock + st.draft_s + st.verify_s + st.other_s
        ends.append(clock)
    return ends


def throughput_figure(steps: Sequence[StepTrace]) -> go.Figure:
    """Tokens per second: per step (bars) and since the run started (line)."""
    if not steps:
        return empty_figure("No steps yet.")
    ends = step_end_times(steps)
    counts = [len(st.new_tokens) for st in steps]
    starts = [0.0] + ends[:-1]
    per_step = [c / (e - s) if e > s else 0.0 for c, s, e in zip(counts, starts, ends)]
    overall = [sum(counts[: i + 1]) / e if e > 0 else 0.0 for i, e in enumerate(ends)]
    x = [st.step for st in steps]
    traces: list[Trace] = [
        dict(type="bar", x=x, y=per_step, name="this step", marker=dict(color="#9ecae1")),
        dict(type="scatter", x=x, y=overall, mode="lines", name="since start", line=dict(color=PATH_COLOR, width=2)),
    ]
    layout = base_layout(
        f"Tokens per second ({overall[-1]:.1f} overall)",
        300,
        xaxis=axis_style("step"),
        yaxis=axis_style("tokens / s", rangemode="tozero"),
        legend=legend_top(),
    )
    return make_figure(traces, layout)
