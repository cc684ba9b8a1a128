"""The timeline: drafter and verifier busy intervals per step (asynchronous drafting overlaps
them), and plain decoding of the same tokens on the same clock: the payoff, drawn."""

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
from talon.figures.payoff import PlainRate
from talon.trace import StepTrace

# (4) Async timeline
# ---------------------------------------------------------------------------------------------


PLAIN_LANE = "plain decoding"


def timeline_figure(steps: Sequence[StepTrace], selected: int | None = None, window: int = 10,
                    plain: PlainRate | None = None) -> go.Figure:
    """Drafter and verifier busy intervals of the last ``window`` steps up to ``selected``.
    Synchronous decoding alternates the two rows; asynchronous drafting overlaps them. With
    ``plain``, a third row: plain decoding writing the same tokens on the same clock (one forward
    a token from the run's start), and where each reaches the last shown step's tokens."""
    if not steps:
        return empty_figure("No steps yet.")
    end = len(steps) - 1 if selected is None else max(0, min(selected, len(steps) - 1))
    first = max(0, end - window + 1)
    shown = steps[first : end + 1]
    current = steps[end].step
    traces = [
        _lane_trace(lane, [(st, a, b) for st in shown for a, b in getattr(st, attr)], color, current)
        for lane, attr, color in (
            ("drafter", "drafter_busy", SOURCE_COLORS["model"]),
            ("verifier", "verifier_busy", SOURCE_COLORS["bonus"]),
        )
    ]
    lanes, annotations, title = ["verifier", "drafter"], [], "Drafter / verifier timeline"
    if plain is not None:
        before = sum(len(st.new_tokens) for st in steps[:first])  # tokens committed before the window
        upto = before + sum(len(st.new_tokens) for st in shown)
        traces.append(_plain_trace(plain, before, upto))
        lanes = [PLAIN_LANE, *lanes]
        done = max((b for st in shown for _, b in st.verifier_busy), default=0.0)
        annotations.append(dict(
            xref="paper", yref="paper", x=0.0, y=1.0, yanchor="bottom", xanchor="left", showarrow=False,
            font=dict(size=12), text=(f"{upto} tokens: speculative {done * 1e3:,.0f} ms, plain decoding "
                                      f"{upto * plain.step_s * 1e3:,.0f} ms ({plain.source})")))
        title = "Speculative steps and plain decoding on one clock"
    layout = base_layout(
        f"{title}, steps {shown[0].step}–{shown[-1].step}",
        290 if plain is not None else 250,
        barmode="overlay",
        showlegend=False,
        margin=dict(l=110, r=20, t=70, b=40),
        xaxis=axis_style("ms since the run started"),
        yaxis=axis_style(categoryorder="array", categoryarray=lanes),
        annotations=annotations,
    )
    return make_figure(traces, layout)


def _plain_trace(plain: PlainRate, before: int, upto: int, most: int = 200) -> Trace:
    """Plain decoding's forwards for tokens ``before`` .. ``upto`` (one a token), at most ``most`` drawn."""
    tokens = list(range(before, upto))[-most:]
    return dict(
        type="bar",
        orientation="h",
        name=PLAIN_LANE,
        x=[plain.step_s * 1e3] * len(tokens),
        base=[t * plain.step_s * 1e3 for t in tokens],
        y=[PLAIN_LANE] * len(tokens),
        marker=dict(color="#9a9a9a", opacity=0.6, line=dict(color="white", width=1)),
        hovertext=[f"plain decoding, token {t + 1}: one forward, {plain.step_s * 1e3:.0f} ms ({plain.source})"
                   for t in tokens],
        hoverinfo="text",
    )


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
