"""The Decode tab's view: ``DecodeView`` renders a session into component updates (one step, the
run-level figures, a streaming update). Its handlers: ``talon.ui.decode_handlers``; its layout and
wiring: ``talon.ui.decode_tab``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import gradio as gr

from talon import figures as F
from talon.trace import StepTrace
from talon.ui.session import Session

STEP_WINDOW = 50  # the steps before the one on screen whose tokens the figures may name


def step_vocab(steps: list[StepTrace], index: int) -> dict[int, str]:
    """The token texts of step ``index`` and the ``STEP_WINDOW`` steps before it: what the tree,
    the inspector and the acceptance figure label tokens with."""
    return F.token_vocab(steps[max(0, index - STEP_WINDOW) : index + 1])


@dataclass
class DecodeView:
    """Output components of the Decode tab; ``outputs()`` keeps their order for the API."""

    summary: gr.HTML
    text: gr.HTML
    slider: gr.Slider
    caption: gr.HTML
    tree: gr.Plot
    gates: gr.Plot
    mask: gr.Plot
    timeline: gr.Plot
    per_step: gr.Plot
    by_depth: gr.Plot
    sources: gr.Plot
    speed: gr.Plot
    download: gr.File
    node_pick: gr.Dropdown
    inspector: gr.HTML
    acceptance: gr.Plot
    cost: gr.Plot
    plain_text: gr.Textbox  # the decoded text as a plain string, for API clients (hidden on the page)
    state: gr.State

    def outputs(self) -> list[Any]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]

    def step_updates(self, session: Session, index: int, full: bool = True, live: bool = False) -> dict[Any, Any]:
        """One step, re-plotted from the stored traces: the text up to it (step-through) or all
        of it with the step highlighted, and its figures (``full=False``: text and tree only;
        ``live``: a streaming update, whose text leaves out the per-token hover titles)."""
        steps = session.steps
        if not steps:
            return {}
        index = session.clamp(index)
        session.shown = index
        st = steps[index]
        updates: dict[Any, Any] = {
            self.text: F.text_html(
                steps, upto=index if session.step_through else None, highlight=index, titles=not live
            ),
            self.slider: gr.update(maximum=max(len(steps) - 1, 1), value=index),
            self.caption: F.step_caption_html(steps, index),
            self.tree: F.tree_figure(st, step_vocab(steps, index)),
        }
        if full:
            node = F.default_node(st)
            updates[self.node_pick] = gr.update(choices=F.node_choices(st), value=node)
            vocab = step_vocab(steps, index)
            updates[self.inspector] = F.node_inspector_html(st, node, vocab)
            updates[self.acceptance] = F.acceptance_figure(st, node, vocab=vocab)
            updates[self.gates] = F.gate_figure(st)
            updates[self.mask] = F.mask_figure(st)
            updates[self.timeline] = F.timeline_figure(steps, index, plain=F.plain_rate(session.summary,
                                                                                         session.ar_summary))
            updates[self.cost] = F.cost_figure(session.summary.cost_model if session.summary else None, steps, index)
            updates[self.per_step] = F.accepted_per_step_figure(steps, index)
        return updates

    def summary_updates(self, session: Session, status: str = "") -> dict[Any, Any]:
        return {
            self.summary: F.summary_html(session.summary, session.steps, session.ar_summary, status),
            self.plain_text: session.summary.text if session.summary is not None else "",
            self.state: session,
        }

    def run_updates(self, session: Session, status: str = "") -> dict[Any, Any]:
        """The summary and the run-level figures."""
        steps = session.steps
        return {
            **self.summary_updates(session, status),
            self.by_depth: F.acceptance_by_depth_figure(steps),
            self.sources: F.source_share_figure(steps),
            self.speed: F.throughput_figure(steps),
        }

    def live_updates(self, session: Session, status: str, full: bool = True) -> dict[Any, Any]:
        """A streaming update: the newest step unless the user is scrubbing (then only the
        slider's range grows) or in step-through mode (then nothing is revealed yet). A light
        update (``full=False``) carries only the summary, the text and the tree."""
        updates = self.run_updates(session, status) if full else self.summary_updates(session, status)
        steps = session.steps
        if not steps:  # a run is starting: what was on screen (an earlier run, the recording) goes
            updates[self.text] = F.text_html([])
            updates[self.caption] = STARTING
        elif session.step_through:
            updates[self.text] = F.text_html(
                [], status=f"{len(steps)} steps recorded; step-through reveals them after the run."
            )
        elif session.follow and steps:
            updates.update(self.step_updates(session, len(steps) - 1, full, live=True))
        elif steps:
            updates[self.slider] = gr.update(maximum=max(len(steps) - 1, 1))
            if full:
                updates[self.per_step] = F.accepted_per_step_figure(steps, session.shown)
        return updates


# the step caption while a run reads its prompt (on a 2-core CPU, 10-20 s before the first step)
STARTING = ('<div class="talon-caption"><b>Reading the prompt.</b> The new run\'s first step appears here; '
            "until then the figures below still show the earlier run.</div>")
