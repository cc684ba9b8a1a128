"""A lesson that travels: a run (or the opening recording), its guided walk, and the lessons of a
lesson atlas, as ONE self-contained HTML file: Plotly inlined, every step's figures and walk
cards embedded as JSON, a step slider and Back / Next in plain JavaScript. No server, no network:
it opens from ``file://``, in a course page, or as a static Hugging Face Space.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from talon import figures as F
from talon.atlas.data import Atlas
from talon.figures.lessons import (
    adaptive_words,
    async_figure,
    async_words,
    calibration_figure,
    calibration_words,
    carried_text_html,
    depth_figure,
    drafters_figure,
    exercises_html,
    funnel_figure,
    hybrid_words,
    retrieval_html,
)
from talon.figures.opening import opening_step
from talon.lessons.adaptive import BUDGETS, AdaptiveLesson, adaptive_lesson, calibration, funnel
from talon.lessons.asynchrony import AsyncBound, async_lesson
from talon.lessons.exercises import exercises
from talon.lessons.hybrid import hybrid_lesson, retrieval_example
from talon.trace import RunSummary, StepTrace

STATIC = Path(__file__).resolve().parents[2] / "static"
APP_CSS = STATIC / "talon.css"  # the summary's and the walk's classes
APP_JS = STATIC / "talon.js"  # the walk's questions and the exercises answer on a press
STYLE = """
body { font-family: Inter, 'Segoe UI', system-ui, sans-serif; max-width: 1100px; margin: 1.5rem auto; color: #222;
       line-height: 1.5; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin-bottom: 0.2rem; } h2 { font-size: 1.2rem; margin-top: 2rem; }
.note { color: #555; font-size: 0.92rem; }
.controls { display: flex; gap: 1rem; align-items: center; margin: 0.6rem 0; flex-wrap: wrap; }
.controls input[type=range] { flex: 1; min-width: 240px; }
.talon-walk-card { border: 1px solid #d7dce5; border-radius: 8px; padding: 0.7rem 0.9rem; background: #f8fafc; }
.talon-walk-head { font-weight: 600; margin-bottom: 0.3rem; }
button { font: inherit; padding: 0.3rem 0.9rem; border-radius: 6px; border: 1px solid #b8c2d3; background: white;
         cursor: pointer; }
.row { display: flex; gap: 1rem; flex-wrap: wrap; } .row > div { flex: 1; min-width: 320px; }
.talon-lesson-text pre { white-space: pre-wrap; word-break: break-word; font-size: 0.9rem; line-height: 1.7; }
.talon-lesson-text .legend span { margin-right: 0.8rem; }
"""

SCRIPT = """
const DATA = JSON.parse(document.getElementById('talon-data').textContent);
const slider = document.getElementById('step');
let stop = 0;
function draw(id, fig) { Plotly.react(id, fig.data, fig.layout, {displaylogo: false, responsive: true}); }
function show() {
  const i = Number(slider.value), step = DATA.steps[i];
  document.getElementById('step-label').textContent = 'step ' + i + ' of ' + (DATA.steps.length - 1);
  draw('tree', step.tree); draw('gates', step.gates);
  document.getElementById('walk').innerHTML = step.walk[stop];
}
document.getElementById('back').onclick = () => { stop = Math.max(0, stop - 1); show(); };
document.getElementById('next').onclick = () => { stop = Math.min(DATA.walk_stops - 1, stop + 1); show(); };
slider.oninput = show;
for (const [id, fig] of Object.entries(DATA.lessons)) draw(id, fig);
show();
"""


def _static(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").replace("</", "<\\/")
    except OSError:
        return ""


def _fig(fig: go.Figure) -> dict[str, Any]:
    """A figure as plain JSON (numpy arrays and all), ready for Plotly.react."""
    return json.loads(fig.to_json())


def _script_json(data: Any) -> str:
    """JSON safe inside a <script> element (no '</' can close it)."""
    return json.dumps(data, separators=(",", ":")).replace("</", "<\\/")


def export_html(summary: RunSummary | None, steps: Sequence[StepTrace], atlas: Atlas | None = None,
                lessons: Sequence[AdaptiveLesson] = (), lesson_index: int = 0, title: str = "Talon lesson") -> str:
    """The page: the run's steps (tree and gates per step, the walk per step), then the
    lessons of ``atlas`` (``lessons``: the adaptive lesson of every lesson atlas, for the funnel
    and the dilemma; ``lesson_index``: ``atlas``'s among them)."""
    if not steps:
        raise ValueError("nothing to export: run a prompt or replay a trace first")
    vocab = F.token_vocab(steps)
    data: dict[str, Any] = {
        "walk_stops": len(F.WALK),
        "steps": [{"tree": _fig(F.tree_figure(st, vocab)), "gates": _fig(F.gate_figure(st)),
                   "walk": [F.walk_html(k, summary, steps, i) for k in range(len(F.WALK))]}
                  for i, st in enumerate(steps)],
        "lessons": {},
    }
    start = opening_step(steps)
    sections = [f"<h1>{html.escape(title)}</h1>",
                '<p class="note">Made by Talon: tree speculative decoding, one step at a time. Everything below works '
                'offline: the figures are Plotly, inlined.</p>',
                f"<h2>The run, step by step</h2><div class=\"note\">{F.summary_html(summary, list(steps))}</div>",
                f'<div class="controls"><input type="range" id="step" min="0" max="{len(steps) - 1}" value="{start}">'
                '<span id="step-label"></span></div>',
                '<div class="row"><div id="tree"></div><div id="gates"></div></div>',
                '<h2>The walk through this step</h2><div class="controls"><button id="back">Back</button>'
                '<button id="next">Next</button></div><div id="walk"></div>']
    if atlas is not None:
        sections += _lesson_sections(atlas, lessons, lesson_index, data["lessons"])
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title>"
            f"<style>{_static(APP_CSS)}{STYLE}</style><script>{get_plotlyjs()}</script></head><body>"
            + "".join(sections)
            + f'<script type="application/json" id="talon-data">{_script_json(data)}</script>'
            + f"<script>{SCRIPT}</script><script>{_static(APP_JS)}</script></body></html>")


@dataclass(frozen=True)
class LessonShow:
    """What the lessons show for one atlas, in the tab and in the exported file alike: words and
    figures (the adaptive ones None when there are no adaptive lessons to show)."""

    adaptive_words: str | None
    depth: go.Figure | None
    funnel: go.Figure | None
    hybrid_words: str
    drafters: go.Figure
    carried: str
    async_words: str
    timeline: go.Figure
    calibration: go.Figure | None = None  # acceptance against confidence, pooled over ``lessons``
    calibration_words: str = ""
    exercises: str = ""  # HTML: predict, then check, answered by replays of this atlas


def show_lessons(atlas: Atlas, lessons: Sequence[AdaptiveLesson], index: int,
                 measured: AsyncBound | None = None) -> LessonShow:
    """The three lessons on ``atlas`` (``lessons[index]`` its adaptive lesson among ``lessons``;
    ``measured``: a real run's timeline for the async lesson)."""
    hybrid, overlap = hybrid_lesson(atlas), async_lesson(atlas)
    example = retrieval_html(retrieval_example(atlas, hybrid), lambda ids: "".join(atlas.text(t) for t in ids))
    lesson = lessons[index] if lessons else None
    calibrated = calibration(lessons)
    tasks = ""
    if lesson is not None:
        small, large = (lesson if n == lesson.budget else adaptive_lesson(atlas, n) for n in BUDGETS)
        tasks = exercises_html(exercises(atlas, small, large, hybrid))
    return LessonShow(
        adaptive_words(lesson, lessons) if lesson else None, depth_figure(lesson) if lesson else None,
        funnel_figure(*funnel(lessons)) if lesson else None, hybrid_words(hybrid), drafters_figure(hybrid),
        carried_text_html(hybrid) + example, async_words(overlap, measured), async_figure(overlap),
        calibration_figure(calibrated) if calibrated else None, calibration_words(calibrated), tasks)


def _lesson_sections(atlas: Atlas, lessons: Sequence[AdaptiveLesson], index: int, figures: dict[str, Any]) -> list[str]:
    """The three lessons on ``atlas`` (their figures go into ``figures`` by element id)."""
    shown = show_lessons(atlas, lessons, index)
    out = [f"<h2>Lessons on a recorded prompt ({html.escape(atlas.suite or 'prompt')})</h2>"
           f'<p class="note">{html.escape(" ".join(atlas.prompt.split())[:300])}</p>']
    if shown.adaptive_words is not None and shown.depth is not None and shown.funnel is not None:
        figures["lesson-depth"] = _fig(shown.depth)
        figures["lesson-funnel"] = _fig(shown.funnel)
        out += ["<h2>Why adaptive?</h2>", f"<p>{html.escape(shown.adaptive_words)}</p>",
                '<div id="lesson-depth"></div><div class="row"><div id="lesson-funnel"></div>'
                '<div id="lesson-calibration"></div></div>', f"<p>{html.escape(shown.calibration_words)}</p>"]
        if shown.calibration is not None:
            figures["lesson-calibration"] = _fig(shown.calibration)
    figures["lesson-drafters"] = _fig(shown.drafters)
    figures["lesson-async"] = _fig(shown.timeline)
    out += ["<h2>Why hybrid?</h2>", f"<p>{html.escape(shown.hybrid_words)}</p>", '<div id="lesson-drafters"></div>',
            shown.carried, "<h2>Why async?</h2>", f"<p>{html.escape(shown.async_words)}</p>",
            '<div id="lesson-async"></div>']
    if shown.exercises:
        out += ["<h2>Try it: predict, then check</h2>", shown.exercises]
    return out
