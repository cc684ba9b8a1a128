"""The adaptive draft-length figures: one rule's drafted length at each step beside what the
target would have accepted (the oracle, from the atlas), and every rule at its defaults and at
its best on the atlas, beside TALON's gate (``talon.atlas.adaptive_sweep``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

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
from talon.figures.text import esc

if TYPE_CHECKING:
    from talon.atlas.adaptive import LengthRun
    from talon.atlas.adaptive_sweep import RuleBest
    from talon.lessons.lengths import LengthLesson

ACCEPT_COLOR = "#009E73"
# where each rule comes from, in a few words (the rules' docstrings cite file and version)
RULE_SOURCES: dict[str, str] = {
    "talon": "TALON's confidence gate (tree)",
    "fixed": "a fixed chain (vLLM, SGLang topk 1)",
    "hf-heuristic": "transformers: +2 / −1, kept across requests",
    "hf-heuristic-transient": "transformers: +2 / −1, reset each request",
    "hf-confidence": "transformers: the dynamic confidence threshold",
    "sglang-adaptive": "SGLang --speculative-adaptive",
    "vllm-dsd": "vLLM: K by batch size (batch 1)",
    "llamacpp-streak": "llama.cpp #25726 (unmerged)",
}


def lengths_figure(run: LengthRun | None, label: str = "") -> go.Figure:
    """Bars: the length ``run``'s rule drafted at each step (by tokens generated before it);
    markers: how many the target accepted; the line: the oracle, how many tokens of the draft's
    own chain the target would have accepted from there, however long it was allowed to grow."""
    if run is None or not run.steps:
        return empty_figure("The adaptive rules' lengths appear once an atlas is recorded or loaded.")
    ps = [s.p for s in run.steps]
    traces: list[Trace] = [
        dict(type="bar", x=ps, y=[s.drafted for s in run.steps], name="drafted (the rule's length)",
             marker=dict(color=PASS_COLOR, opacity=0.55),
             hovertext=[f"after {s.p} tokens: allowed {s.allowed}, drafted {s.drafted}, accepted {s.accepted}, "
                        f"the oracle {s.oracle}" for s in run.steps], hoverinfo="text"),
        dict(type="scatter", mode="markers", x=ps, y=[s.accepted for s in run.steps], name="accepted",
             marker=dict(color=ACCEPT_COLOR, size=9, symbol="diamond")),
        dict(type="scatter", mode="lines", x=ps, y=[s.oracle for s in run.steps], line_shape="hv",
             name="the oracle (what the target would accept)", line=dict(color=GATED_COLOR, width=2)),
    ]
    wasted = sum(s.drafted - s.accepted for s in run.steps)
    missed = sum(max(s.oracle - s.drafted, 0) for s in run.steps)
    layout = base_layout(
        f"{label or run.rule}: {wasted} drafted tokens rejected, {missed} acceptable not drafted", 360,
        xaxis=axis_style("tokens generated before the step"), yaxis=axis_style("tokens"),
        legend=legend_top(), barmode="overlay",
    )
    return make_figure(traces, layout)


def rules_table_html(bests: Sequence[RuleBest], note: str = "") -> str:
    """Each rule at its defaults and at its best setting on the atlas (MAT, predicted tokens/s),
    best first; TALON's gate at the knobs at hand."""
    if not bests:
        return f'<div class="talon-summary">{esc(note) or "No atlas yet: record one or upload one."}</div>'
    rows = []
    for b in bests:
        knobs = ", ".join(f"{k}={v}" for k, v in b.best.knobs.items() if b.defaults.knobs.get(k) != v)
        cover = "" if not b.best.misses else f" ({b.best.misses} step(s) outside the atlas)"
        rows.append(
            f"<tr><td><b>{esc(b.rule)}</b><br><small>{esc(RULE_SOURCES.get(b.rule, ''))}</small></td>"
            f"<td>{b.defaults.mat:.2f}</td><td>{b.defaults.tokens_per_s:.1f}</td>"
            f"<td>{esc(knobs or 'its defaults')}{esc(cover)}</td>"
            f"<td>{b.best.mat:.2f}</td><td><b>{b.best.tokens_per_s:.1f}</b></td></tr>")
    table = ("<table><tr><th>rule</th><th>MAT, defaults</th><th>tok/s, defaults</th><th>best setting</th>"
             "<th>MAT, best</th><th>tok/s, best</th></tr>" + "".join(rows) + "</table>")
    words = f'<div class="talon-status">{esc(note)}</div>' if note else ""
    return f'<div class="talon-summary talon-compare">{table}{words}</div>'




TRACK_COLORS = (PASS_COLOR, "#E69F00", "#CC79A7")


def length_lesson_figure(lesson: LengthLesson) -> go.Figure:
    """Each rule's drafted length (TALON: its tree's depth) by position, over the oracle."""
    first = lesson.tracks[0]
    oracle = sorted({(p, o) for t in lesson.tracks for p, o in zip(t.p, t.oracle)})
    traces: list[Trace] = [dict(type="scatter", mode="lines", x=[p for p, _ in oracle], y=[o for _, o in oracle],
                                line_shape="hv", name="the oracle", line=dict(color=GATED_COLOR, width=2))]
    for track, color in zip(lesson.tracks, TRACK_COLORS):
        traces.append(dict(type="scatter", mode="lines+markers", x=track.p, y=track.drafted, name=track.name,
                           line=dict(color=color, width=1.5, dash="dot" if track is not first else "solid"),
                           marker=dict(size=6, color=color)))
    layout = base_layout("Drafted length by position, against what the target would accept", 360,
                         xaxis=axis_style("tokens generated before the step"),
                         yaxis=axis_style("tokens drafted (TALON: the tree's depth)"), legend=legend_top())
    return make_figure(traces, layout)


def length_lesson_words(lesson: LengthLesson, totals: dict[str, tuple[int, int, float]] | None = None) -> str:
    """What the replays show, in plain sentences built from them (the page escapes and folds them)."""
    talon, *history = lesson.tracks
    better = max(lesson.tracks, key=lambda t: t.tokens_per_s)
    lines = [f"On this prompt {better.name} is the fastest, {better.tokens_per_s:.1f} tok/s predicted."]
    for t in lesson.tracks:
        lag, at = t.lag()
        lines.append(f"{t.name}: {t.mat:.2f} tokens a step, {t.tokens_per_s:.1f} tok/s; {t.shortfall} acceptable "
                     f"tokens not drafted, {t.waste} drafted and rejected"
                     + (f"; too few drafted {lag} steps in a row from token {at}." if lag > 1 else "."))
    lagging = max(history, key=lambda t: t.lag()[0])
    lag, at = lagging.lag()
    if lag > 1 and lag > talon.lag()[0]:
        lines.append(f"History lags: from token {at} the text turned easy (the oracle rose) and {lagging.name} "
                     f"drafted too few for {lag} steps in a row while its length grew back; TALON's gate, which "
                     f"reads the draft's confidence at every step, did so for at most {talon.lag()[0]}.")
    else:
        lines.append("No history rule lagged behind the oracle longer than TALON's gate here.")
    if talon.confident_misses:
        lines.append(f"Confidence misled TALON {talon.confident_misses} time(s): a node the draft gave q of "
                     f"{lesson.confident:g} or more was rejected, and the depth bought on it was wasted.")
    else:
        lines.append(f"The draft was never confidently wrong here (no rejected node with q of {lesson.confident:g} "
                     "or more).")
    if totals:
        parts = [f"{name} {s} not drafted, {w} rejected, {m:.2f} tokens a step"
                 for name, (s, w, m) in totals.items()]
        lines.append("Over the bundled prompts: " + "; ".join(parts) + ".")
    return " ".join(lines)
