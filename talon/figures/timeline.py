"""The async timeline: drafter and verifier busy intervals per step, the overlap drawn."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

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
