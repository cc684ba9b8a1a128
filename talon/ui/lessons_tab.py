"""The Lessons tab: the papers' claims on the bundled lesson atlases (``data/lessons``), replayed
with no model: why adaptive (TALON: the static depth dilemma, the funnel, the adaptive tree at an
equal budget), why hybrid (Talon: which source carried each step) and why async (drafting hidden
behind verification, on this host's curves and an H100's measured ones). A prompt and a budget pick
what is shown; three exercises ask what a knob will do and answer with a replay. Every number
comes from ``talon.lessons``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from talon import figures as F
from talon.atlas.data import Atlas
from talon.atlas.explorer import AtlasSession
from talon.figures.export import export_html, show_lessons
from talon.figures.lessons import head_figure, head_words, mtp_lineup_figure, mtp_lineup_words
from talon.lessons import bundled_atlases
from talon.lessons.adaptive import BUDGETS, AdaptiveLesson, adaptive_lesson
from talon.lessons.asynchrony import AsyncBound, bound_of
from talon.lessons.head import head_vs_model, pairs_of
from talon.lessons.lengths import length_lesson, lesson_totals
from talon.lessons.mtp import lineups_of, mtp_lineup
from talon.trace import TraceFileError
from talon.ui.files import read_atlas, write_lesson
from talon.ui.recording import load_recording
from talon.ui.session import Session, bounded
from talon.ui.words import EXPLAIN


@functools.cache
def lesson_atlases() -> tuple[Atlas, ...]:
    """The bundled lesson atlases, read once per process (empty when they are not shipped)."""
    try:
        return tuple(bundled_atlases())
    except (TraceFileError, OSError):
        return ()


@functools.cache
def adaptive_lessons(budget: int) -> tuple[AdaptiveLesson, ...]:
    return tuple(adaptive_lesson(a, budget) for a in lesson_atlases())


def atlas_label(index: int, atlas: Atlas) -> str:
    first = " ".join(atlas.prompt.split())[:60]
    return f"{atlas.suite}: {first}…" if len(atlas.prompt) > 60 else f"{atlas.suite}: {first}"


@dataclass
class LessonsView:
    prompt: gr.Dropdown
    budget: gr.Radio
    adaptive_text: gr.HTML
    depth: gr.Plot
    funnel: gr.Plot
    hybrid_text: gr.HTML
    drafters: gr.Plot
    carried: gr.HTML
    async_text: gr.HTML
    timeline: gr.Plot
    calibration: gr.Plot
    calibration_text: gr.HTML
    exercises: gr.HTML
    export: gr.Button
    download: gr.File
    lengths_text: gr.HTML
    lengths: gr.Plot

    def outputs(self) -> list[Any]:
        return [self.adaptive_text, self.depth, self.funnel, self.hybrid_text, self.drafters, self.carried,
                self.async_text, self.timeline, self.calibration, self.calibration_text, self.exercises,
                self.lengths_text, self.lengths]


OWN = -1  # the dropdown's value for the session's own atlas (Threshold explorer)


@dataclass(frozen=True)
class Picked:
    atlas: Atlas
    lessons: tuple[AdaptiveLesson, ...]  # the bundled prompts' adaptive lessons, the own atlas's last
    index: int  # the picked atlas's lesson among them


def pick(index: Any, budget: Any, atlas_state: Any) -> Picked | None:
    """The lesson atlas the page picked (values from the page: checked), or None when none exist."""
    atlases = lesson_atlases()
    own = atlas_state.atlas if isinstance(atlas_state, AtlasSession) else None
    try:
        i, n = int(index), int(budget)
    except (TypeError, ValueError):
        i, n = 0, BUDGETS[-1]
    n = n if n in BUDGETS else BUDGETS[-1]
    if i == OWN and own is not None:
        return Picked(own, (*adaptive_lessons(n), adaptive_lesson(own, n)), len(atlases))
    if not atlases:
        return None
    i = max(0, min(i, len(atlases) - 1))
    return Picked(atlases[i], adaptive_lessons(n), i)


def prompt_choices(atlas_state: Any) -> list[tuple[str, int]]:
    choices = [(atlas_label(i, a), i) for i, a in enumerate(lesson_atlases())]
    if isinstance(atlas_state, AtlasSession) and atlas_state.atlas is not None:
        choices.append((f"your atlas (Threshold explorer): {' '.join(atlas_state.atlas.prompt.split())[:50]}", OWN))
    return choices


def measured_bound(session: Any) -> AsyncBound | None:
    """The Decode tab's run (or the opening recording) as an async bound on its measured times."""
    if isinstance(session, Session) and session.steps:
        return bound_of("the Decode tab's run", session.steps, sum(len(s.new_tokens) for s in session.steps))
    return None


def _words(text: str) -> str:
    """A lesson's words as the page shows them: terms defined, the lead first, the rest folded."""
    return f'<div class="talon-explain">{F.define(F.fold(F.esc(text)))}</div>'


def make_show() -> Callable[..., tuple[Any, ...]]:
    @bounded("computing the lessons")
    def show(index: Any, budget: Any, atlas_state: Any, session: Any = None) -> tuple[Any, ...]:
        """The three lessons on the picked atlas at budget N (``session``: the Decode tab's run)."""
        picked = pick(index, budget, atlas_state)
        if picked is None:
            empty = F.empty_figure("The lesson atlases are not installed (data/lessons).")
            return ("", empty, empty, "", empty, "", "", empty, empty, "", "", "", empty)
        shown = show_lessons(picked.atlas, picked.lessons, picked.index, measured_bound(session))
        lengths = length_lesson(picked.atlas, int(picked.lessons[picked.index].budget))
        return (_words(shown.adaptive_words or ""), shown.depth, shown.funnel, _words(shown.hybrid_words),
                shown.drafters, shown.carried, _words(shown.async_words), shown.timeline,
                shown.calibration or F.empty_figure("No adaptive lessons to bin."), _words(shown.calibration_words),
                f'<div class="talon-exercises">{F.define(shown.exercises)}</div>',
                _words(F.length_lesson_words(lengths, length_totals(lengths.budget))), F.length_lesson_figure(lengths))

    return show


@functools.cache
def length_totals(budget: int) -> dict[str, tuple[int, int, float]]:
    """The adaptive-length lesson's totals over the bundled prompts, once per budget."""
    return lesson_totals(lesson_atlases(), budget)


def make_refresh() -> Callable[..., tuple[Any, ...]]:
    show = make_show()

    @bounded("computing the lessons")
    def refresh(index: Any, budget: Any, atlas_state: Any, session: Any = None) -> tuple[Any, ...]:
        """On opening the tab: the prompts (the session's own atlas joins them), then the lessons."""
        return (gr.update(choices=prompt_choices(atlas_state)), *show(index, budget, atlas_state, session))

    return refresh


def make_export() -> Callable[[Any, Any, Any, Any], str]:
    @bounded("exporting the lessons")
    def export(session: Any, index: Any, budget: Any, atlas_state: Any) -> str:
        """The Decode tab's run (or the opening recording) with the shown lessons, as one HTML file."""
        steps = list(session.steps) if isinstance(session, Session) and session.steps else []
        summary = session.summary if steps else None
        if not steps:
            recording = load_recording()
            if recording is None:
                raise gr.Error("Nothing to export yet: run a prompt on the Decode tab first.")
            summary, steps = recording[0], list(recording[1])
        picked = pick(index, budget, atlas_state)
        page = export_html(summary, steps, picked.atlas if picked else None, picked.lessons if picked else (),
                           picked.index if picked else 0,
                           title="Talon: one run, step by step, and what the papers claim")
        return write_lesson(page)

    return export


def build_lessons_tab(atlas_state: gr.State, run_state: gr.State) -> LessonsView:
    """The Lessons tab, built and wired (call inside the tab); it needs no model. ``atlas_state``:
    the Threshold explorer's, whose atlas joins the lesson prompts; ``run_state``: the Decode tab's
    session, whose measured timeline the async lesson reads."""
    gr.Markdown(EXPLAIN["lessons"], elem_classes=["talon-explain"])
    choices = prompt_choices(None)
    with gr.Row():
        prompt = gr.Dropdown(choices=choices, value=0 if choices else None, label="Lesson prompt (recorded on the "
                             "embedded pair)", elem_id="talon-lesson-prompt", scale=3)
        budget = gr.Radio(choices=list(BUDGETS), value=BUDGETS[-1], label="Budget N (nodes verified per step)",
                          elem_id="talon-lesson-budget", scale=1)
    gr.Markdown("### Why adaptive? The static depth dilemma")
    adaptive_text = gr.HTML(elem_id="talon-lesson-adaptive")
    depth = gr.Plot(elem_id="talon-lesson-depth", show_label=False)
    with gr.Row():
        funnel_plot = gr.Plot(elem_id="talon-lesson-funnel", show_label=False)
        calibration = gr.Plot(elem_id="talon-lesson-calibration", show_label=False)
    calibration_text = gr.HTML(elem_id="talon-lesson-calibration-text")
    gr.Markdown("### Why hybrid? Where each source carries the step")
    hybrid_text = gr.HTML(elem_id="talon-lesson-hybrid")
    drafters = gr.Plot(elem_id="talon-lesson-drafters", show_label=False)
    carried = gr.HTML(elem_id="talon-lesson-carried")
    gr.Markdown("### Why async? Drafting hidden behind verification")
    async_text = gr.HTML(elem_id="talon-lesson-async")
    timeline = gr.Plot(elem_id="talon-lesson-timeline", show_label=False)
    gr.Markdown("### Who adapts better, the tree's confidence or the acceptance history?")
    lengths_text = gr.HTML(elem_id="talon-lesson-lengths-text")
    lengths = gr.Plot(elem_id="talon-lesson-lengths", show_label=False)
    gr.Markdown("### A head against a draft model: the drafter TALON's claims are made on")
    with gr.Row():
        head_files = gr.File(label="Atlases of one prompt: a head's and a draft model's", file_count="multiple",
                             file_types=[".json"], height=150, elem_id="talon-lesson-head-files", scale=1)
        head_text = gr.HTML(head_missing([]), elem_id="talon-lesson-head-text", scale=2)
    head_plot = gr.Plot(elem_id="talon-lesson-head", show_label=False, visible=False)
    gr.Markdown("### MTP against EAGLE-3 against a draft model: the drafter the model ships")
    with gr.Row():
        mtp_files = gr.File(label="Atlases of one prompt: the MTP layer's and a head's or a draft model's",
                            file_count="multiple", file_types=[".json"], height=150, elem_id="talon-lesson-mtp-files",
                            scale=1)
        mtp_text = gr.HTML(mtp_missing([]), elem_id="talon-lesson-mtp-text", scale=2)
    mtp_plot = gr.Plot(elem_id="talon-lesson-mtp", show_label=False, visible=False)
    gr.Markdown("### Try it: predict, then check (each answer is a replay of this prompt)")
    tasks = gr.HTML(elem_id="talon-lesson-exercises")
    with gr.Row():
        export = gr.Button("Take this lesson along: one HTML file (the run on the Decode tab, its walk, these lessons)",
                           elem_id="talon-lesson-export")
        download = gr.File(label="The lesson, offline (open it in any browser)", elem_id="talon-lesson-download",
                           interactive=False)
    view = LessonsView(prompt, budget, adaptive_text, depth, funnel_plot, hybrid_text, drafters, carried,
                       async_text, timeline, calibration, calibration_text, tasks, export, download, lengths_text,
                       lengths)
    for control in (prompt, budget):
        control.change(make_show(), [prompt, budget, atlas_state, run_state], view.outputs(), api_visibility="private",
                       show_progress="hidden")
    for event in (head_files.change, budget.change):
        event(compare_head, [head_files, budget, atlas_state], [head_text, head_plot], api_visibility="private",
              show_progress="hidden")
    for event in (mtp_files.change, budget.change):
        event(compare_mtp, [mtp_files, budget, atlas_state], [mtp_text, mtp_plot], api_visibility="private",
              show_progress="hidden")
    return view


def head_missing(atlases: list[Atlas]) -> str:
    """What the comparison still needs, said from the atlases at hand."""
    kinds = {a.draft_kind for a in atlases}
    need = ("an atlas recorded with an EAGLE-3 head (the Threshold explorer on a head preset, or talon atlas record "
            "--draft HEAD_DIR) and one of the same prompt with a draft model")
    if kinds == {"head", "draft"}:
        need = "two atlases of the same prompt and target (these differ in prompt or text)"
    elif kinds:
        other = "a draft model" if kinds == {"head"} else "an EAGLE-3 head"
        need = f"an atlas of the same prompt recorded with {other}"
    return _words(f"Upload {need} (the Threshold explorer's atlas counts as one): both are replayed here at the "
                  "same knobs, with no model.")


def at_hand(files: Any, budget: Any, atlas_state: Any) -> tuple[list[Atlas], int]:
    """The uploaded atlases and the explorer's, and the lessons' budget (its first where it is none)."""
    atlases = [read_atlas(f) for f in (files or [])]
    if isinstance(atlas_state, AtlasSession) and atlas_state.atlas is not None:
        atlases.append(atlas_state.atlas)
    return atlases, int(budget) if str(budget).isdigit() and int(budget) in BUDGETS else BUDGETS[0]


@bounded("comparing the head")
def compare_head(files: Any, budget: Any, atlas_state: Any) -> tuple[str, Any]:
    """The head against the draft model on the first prompt with both atlases (uploads and the
    explorer's), at the lessons' budget."""
    atlases, n = at_hand(files, budget, atlas_state)
    found = pairs_of(atlases)
    if not found:
        return head_missing(atlases), gr.update(visible=False)
    lesson = head_vs_model(*found[0], budget=n)
    return _words(head_words(lesson)), gr.update(value=head_figure(lesson), visible=True)


def mtp_missing(atlases: list[Atlas]) -> str:
    """What the MTP lineup still needs, said from the atlases at hand."""
    kinds = {a.draft_kind for a in atlases}
    if "mtp" not in kinds:
        need = ("an atlas recorded with the target's MTP layer (talon atlas record --drafter mtp --target DIR, or the "
                "Threshold explorer on a target that ships one) and one of the same prompt with an EAGLE-3 head or a "
                "draft model")
    elif kinds == {"mtp"}:
        need = "an atlas of the same prompt and target recorded with an EAGLE-3 head or a draft model"
    else:
        need = "atlases of the same prompt and target (these differ in prompt or text)"
    return _words(f"Upload {need} (the Threshold explorer's atlas counts as one): each drafter is replayed alone "
                  "here at the same knobs, with no model.")


@bounded("comparing the MTP layer")
def compare_mtp(files: Any, budget: Any, atlas_state: Any) -> tuple[str, Any]:
    """The MTP layer against a head and a draft model on the first prompt with an MTP atlas and
    another (uploads and the explorer's), at the lessons' budget."""
    atlases, n = at_hand(files, budget, atlas_state)
    found = lineups_of(atlases)
    if not found:
        return mtp_missing(atlases), gr.update(visible=False)
    lesson = mtp_lineup(found[0], budget=n)
    return _words(mtp_lineup_words(lesson)), gr.update(value=mtp_lineup_figure(lesson), visible=True)
