"""The Decode tab: its layout and wiring (the figures' rows, the buttons, the events), and its
behaviour: ``DecodeView`` renders a session into component updates (one step, the run-level
figures, a streaming update), and the handlers run (with the optional autoregressive baseline),
replay a trace file, move the step slider, Prev / Next / Latest."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from talon import figures as F
from talon.figures.opening import RECORDING, SAMPLED_RECORDING, opening_step
from talon.run_config import ConfigError
from talon.server.facade import Controls, RunRequest, decode_all, start_status, user_error, wait_for_pair
from talon.settings import Settings
from talon.trace import TraceFileError, parse_trace, read_json_upload
from talon.ui.files import upload_path, write_trace
from talon.ui.panel import ControlPanel, model_event
from talon.ui.recording import RECORDING_NOTE, SAMPLED_NOTE, load_recording
from talon.ui.session import Session, sessionless
from talon.ui.stream import stream_run
from talon.ui.walk_panel import WalkView, full_tree_button, make_offer_full_tree, walk_panel, wire_walk
from talon.ui.words import EXPLAIN, TEXT_LEGEND

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# The tab: components and wiring
# ---------------------------------------------------------------------------------------------


@dataclass
class DecodeButtons:
    """The Decode tab's inputs besides the control panel."""

    prev: gr.Button
    next: gr.Button
    latest: gr.Button
    upload: gr.File
    full_tree: gr.Button
    sampled: gr.Button


def figure_row(key: str, label: str) -> gr.Plot:
    with gr.Row(equal_height=False):
        plot = gr.Plot(
            label=label, show_label=False, scale=3, min_width=420, elem_classes=["talon-plot"], elem_id=f"talon-{key}"
        )
        gr.Markdown(EXPLAIN[key], elem_classes=["talon-explain"], min_width=200)
    return plot


def run_plot(key: str, label: str) -> gr.Plot:
    """A run-level figure with its explanation below it, half a row wide."""
    with gr.Column(min_width=320):
        plot = gr.Plot(label=label, show_label=False, elem_id=f"talon-{key.replace('_', '-')}")
        gr.Markdown(EXPLAIN[key], elem_classes=["talon-explain"])
    return plot


def decode_panel() -> tuple[DecodeView, WalkView, DecodeButtons]:
    """The Decode tab's components (call inside the tab); ``wire_decode`` gives them behaviour."""
    summary = gr.HTML(F.summary_html(None, []), label="summary", elem_id="talon-summary")
    with gr.Row(elem_id="talon-offers"):
        walk = walk_panel()
        full_tree = full_tree_button()
    gr.HTML(TEXT_LEGEND)
    text = gr.HTML(F.text_html([]), label="text", elem_id="talon-text", autoscroll=True, max_height=420)
    with gr.Row(elem_id="talon-stepper"):
        prev = gr.Button("◀ Prev", size="sm", min_width=70, scale=0, elem_id="talon-prev")
        slider = gr.Slider(0, 1, value=0, step=1, label="Step", scale=6, elem_id="talon-slider")
        nxt = gr.Button("Next ▶", size="sm", min_width=70, scale=0, elem_id="talon-next")
        latest = gr.Button("Latest »", size="sm", min_width=80, scale=0, elem_id="talon-latest")
    caption = gr.HTML(F.step_caption_html([], 0), label="step caption", elem_id="talon-caption")
    tree = figure_row("tree", "Draft tree")
    with gr.Row(equal_height=False, elem_id="talon-inspector-row"):
        with gr.Column(scale=3, min_width=420):
            node_pick = gr.Dropdown(label="Node inspector: pick a node of this step", choices=[], value=None,
                                    elem_id="talon-node-pick")
            inspector = gr.HTML(F.node_inspector_html_empty(), elem_id="talon-inspector")
            acceptance = gr.Plot(label="How the target decided the node", show_label=False,
                                 elem_classes=["talon-plot"], elem_id="talon-acceptance")
        with gr.Column(scale=1, min_width=200):
            gr.Markdown(EXPLAIN["inspector"], elem_classes=["talon-explain"])
            gr.Markdown(F.define(F.fold(F.RULE_WORDS)), elem_classes=["talon-explain"], elem_id="talon-rule")
    gates = figure_row("gates", "Confidence gates")
    mask = figure_row("mask", "Attention mask")
    timeline = figure_row("timeline", "Timeline")
    cost = figure_row("cost", "Cost model")
    gr.Markdown("### The whole run")
    with gr.Row():
        per_step = run_plot("per_step", "tokens per step")
        by_depth = run_plot("by_depth", "acceptance by depth")
    with gr.Row():
        sources = run_plot("sources", "sources")
        speed = run_plot("speed", "tokens per second")
    with gr.Row():
        download = gr.File(label="Download the trace (JSON)", interactive=False, elem_id="talon-download")
        upload = gr.File(label="Replay a trace (no model needed)", file_types=[".json"], elem_id="talon-upload")
        sampled = gr.Button("Open a sampled run: drafts kept or rejected by chance (no model needed)", size="sm",
                            elem_id="talon-sampled")
    view = DecodeView(
        summary=summary,
        text=text,
        slider=slider,
        caption=caption,
        tree=tree,
        gates=gates,
        mask=mask,
        timeline=timeline,
        per_step=per_step,
        by_depth=by_depth,
        sources=sources,
        speed=speed,
        download=download,
        node_pick=node_pick,
        inspector=inspector,
        acceptance=acceptance,
        cost=cost,
        plain_text=gr.Textbox(visible=False, label="text", elem_id="talon-plain-text"),
        state=gr.State(Session()),
    )
    return view, walk, DecodeButtons(prev=prev, next=nxt, latest=latest, upload=upload, full_tree=full_tree,
                                     sampled=sampled)


def wire_decode(view: DecodeView, walk: WalkView, buttons: DecodeButtons, panel: ControlPanel,
                settings: Settings) -> None:
    """Run, the offer of a full tree, the step slider, Prev / Next / Latest, the node inspector,
    trace replay, and the guided walk."""
    model_events = model_event(settings)
    kwargs = {
        **panel.components,
        "compare_ar": panel.compare_ar,
        "step_through": panel.step_through,
        "session": view.state,
    }
    run_inputs: dict[str, Any] = dict(inputs=[panel.prompt], inputs_kwargs=kwargs, outputs=view.outputs())
    generate = make_generate(view, settings)
    full_tree = buttons.full_tree
    offer = dict(fn=make_offer_full_tree(full_tree), inputs=[view.state], outputs=[full_tree],
                 concurrency_limit=None, show_progress="hidden", api_visibility="private")
    panel.run.click(generate, **run_inputs, api_name="generate", **model_events).then(**offer)
    panel.prompt.submit(generate, **run_inputs, api_visibility="private", **model_events).then(**offer)
    # the offer's one click: the same run with cost-aware planning off, everything else kept
    full_tree.click(lambda: (False, gr.update(visible=False)), None, [panel.components["cost_aware"], full_tree],
                    api_visibility="private", concurrency_limit=None, show_progress="hidden").then(
        generate, **run_inputs, api_visibility="private", **model_events).then(**offer)
    quick = dict(outputs=view.outputs(), concurrency_limit=None, show_progress="hidden", api_visibility="private")
    view.slider.input(make_show_step(view), [view.slider, view.state], trigger_mode="always_last", **quick)
    view.node_pick.input(make_inspect(view), [view.node_pick, view.state], [view.inspector, view.acceptance],
                         concurrency_limit=None, show_progress="hidden", api_visibility="private")
    buttons.prev.click(make_nudge(view, -1), [view.state], **quick)
    buttons.next.click(make_nudge(view, +1), [view.state], **quick)
    buttons.latest.click(make_nudge(view, 0), [view.state], **quick)
    buttons.sampled.click(make_open_sampled(view), [view.state], view.outputs(), api_visibility="private",
                          concurrency_limit=None, show_progress="hidden")
    buttons.upload.upload(
        make_replay(view), [buttons.upload, view.state], view.outputs(), api_name="replay_on_page",
        api_visibility="private", concurrency_limit=None
    ).then(**offer)
    gr.Button(visible=False).click(sessionless(make_replay(view), Session), [buttons.upload],  # the API's
                                   [o for o in view.outputs() if o is not view.state], api_name="replay",
                                   concurrency_limit=None)
    wire_walk(walk, view.state)


def build_decode_tab(panel: ControlPanel, settings: Settings) -> DecodeView:
    """The Decode tab, built and wired (call inside the tab)."""
    view, walk, buttons = decode_panel()
    wire_decode(view, walk, buttons, panel, settings)
    return view


# ---------------------------------------------------------------------------------------------
# The view and its handlers
# ---------------------------------------------------------------------------------------------


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
            self.tree: F.tree_figure(st, F.token_vocab(steps[max(0, index - 50) : index + 1])),
        }
        if full:
            node = F.default_node(st)
            updates[self.node_pick] = gr.update(choices=F.node_choices(st), value=node)
            vocab = F.token_vocab(steps[max(0, index - 50) : index + 1])
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

AUTOREGRESSIVE = {"drafter": "none", "async_draft": False}  # the baseline: one target forward per token


def make_generate(view: DecodeView, settings: Settings) -> Callable[..., Iterator[dict[Any, Any]]]:
    def generate(
        prompt: str, session: Session, compare_ar: bool = False, step_through: bool = False, **controls: Any
    ) -> Iterator[dict[Any, Any]]:
        """Run speculative decoding on the prompt; streams the text, the figures of the newest
        step, the run-level figures and, at the end, the summary and the trace file. The run and
        its autoregressive baseline (the same prompt and sampling with no drafter) are one action:
        one device call (one ZeroGPU reservation)."""
        values = Controls(**controls)
        cancel = threading.Event()
        session.cancel = cancel  # Stop ends the wait for the models too
        try:
            for note in wait_for_pair(settings, values.preset, cancel):
                yield {view.summary: F.summary_html(session.summary, session.steps, session.ar_summary, note),
                       view.caption: f'<div class="talon-caption"><b>Waiting for the models.</b> {F.esc(note)}.</div>'}
        except ConfigError as error:
            raise user_error(str(error)) from error
        if cancel.is_set():
            gr.Info("Stopped while the models loaded: nothing ran. They go on loading for the next run.")
            yield {view.caption: '<div class="talon-caption">Stopped while the models loaded: nothing ran. They '
                                 "go on loading for the next run.</div>"}
            return
        requests = [RunRequest(prompt, values)] + ([RunRequest(prompt, values, AUTOREGRESSIVE)] if compare_ar else [])
        action = decode_all(settings, requests, cancel)
        session.begin(bool(step_through), cancel)
        yield session.unsent(view.live_updates(session, start_status(action)))
        for full in stream_run(action.runs[0], session.steps.append):
            yield session.unsent(view.live_updates(session, f"running… step {len(session.steps)}", full))
        session.summary = action.summaries[0]
        if compare_ar and not cancel.is_set():
            yield session.unsent(view.live_updates(session, "measuring the autoregressive baseline…"))
            action.finish()
            session.ar_summary = None if cancel.is_set() else action.summaries[1]
            if (parted := F.parting_words(session.summary, session.ar_summary)) is not None:
                gr.Warning(parted)
        if cancel.is_set():
            gr.Info(f"Stopped after step {len(session.steps)}: the figures and the trace hold what ran.")
        elif F.model_skipped_most(session.summary, session.steps):
            gr.Info("The draft model was skipped on most steps: its trees did not pay on this host. \"Show the full "
                    "TALON tree\" runs the prompt again with cost-aware planning off.")
        yield final_updates(view, session)  # complete: API clients read every output of the last update

    return generate


def final_updates(view: DecodeView, session: Session, write: bool = True) -> dict[Any, Any]:
    """Every output at the end of a run (``write``: also save its trace for download)."""
    cancelled = session.summary.stop_reason == "cancelled" if session.summary else bool(session.steps)
    status = "stopped" if cancelled else ""
    if write and session.summary is not None and session.steps:
        session.trace_path = write_trace(session.summary, session.steps)
    updates = view.run_updates(session, status)
    if session.steps:
        session.follow = not session.step_through
        updates.update(view.step_updates(session, 0 if session.step_through else len(session.steps) - 1))
    updates[view.download] = session.trace_path
    return updates


def make_open_sampled(view: DecodeView, path: Path = SAMPLED_RECORDING) -> Callable[[Session], dict[Any, Any]]:
    def open_sampled(session: Session) -> dict[Any, Any]:
        """The shipped sampled recording, on its first step whose draft the target rejected by chance."""
        if session.cancel is not None and session.summary is None:
            raise user_error("a run is in progress: press Stop first, then open the sampled run")
        recording = load_recording(path)
        if recording is None:
            raise user_error("the sampled recording is not shipped with this copy of the app")
        summary, steps = recording
        session.begin(step_through=False, cancel=None)
        session.steps, session.summary = list(steps), summary
        updates = final_updates(view, session, write=False)
        session.follow = False
        chance = [i for i, st in enumerate(steps) if st.bonus_kind == "resampled" and st.accept_len]
        updates.update(view.step_updates(session, chance[0] if chance else opening_step(steps)))
        updates[view.summary] = F.summary_html(summary, session.steps, None, SAMPLED_NOTE)
        return updates

    return open_sampled


def make_replay(view: DecodeView) -> Callable[[Any, Session], dict[Any, Any]]:
    def replay(trace_file: Any, session: Session) -> dict[Any, Any]:
        """Load a downloaded trace (talon-trace/1 JSON) and re-plot every figure, no model needed."""
        if not trace_file:
            raise gr.Error("no file: upload a trace JSON downloaded from this app")
        try:
            summary, steps = parse_trace(read_json_upload(upload_path(trace_file)))
        except (TraceFileError, OSError) as error:
            raise user_error(f"cannot replay this trace: {error}") from error
        session.begin(step_through=False, cancel=None)
        session.steps, session.summary = steps, summary
        updates = final_updates(view, session)
        updates[view.summary] = F.summary_html(summary, steps, None, f"replayed trace of {len(steps)} steps")
        return updates

    return replay


def make_show_recording(view: DecodeView, path: Path = RECORDING) -> Callable[[Session], dict[Any, Any]]:
    def show_recording(session: Session) -> dict[Any, Any]:
        """At page load: the shipped recording of the default pair, so every figure, the slider
        and the inspector work before a model is loaded. Run replaces it."""
        recording = load_recording(path)
        if recording is None or session.steps or session.cancel is not None:  # a run came first
            return {}
        summary, steps = recording
        session.begin(step_through=False, cancel=None)
        session.steps, session.summary = list(steps), summary
        updates = final_updates(view, session, write=False)
        session.follow = False
        updates.update(view.step_updates(session, opening_step(steps)))  # the step that shows the most
        updates[view.summary] = F.summary_html(summary, session.steps, None, RECORDING_NOTE)
        return updates

    return show_recording


def make_show_step(view: DecodeView) -> Callable[[Any, Session], dict[Any, Any]]:
    def show_step(index: Any, session: Session) -> dict[Any, Any]:
        session.follow, session.sent = False, {}
        return view.step_updates(session, session.clamp(index))

    return show_step


def make_inspect(view: DecodeView) -> Callable[[Any, Session], dict[Any, Any]]:
    def inspect(node: Any, session: Session) -> dict[Any, Any]:
        """The inspector table for ``node`` of the step on screen."""
        session.sent.pop(id(view.inspector), None)
        session.sent.pop(id(view.acceptance), None)
        empty = {view.inspector: F.node_inspector_html_empty(), view.acceptance: F.empty_figure("")}
        if not session.steps or node is None:
            return empty
        index = session.clamp(session.shown)
        steps = session.steps
        try:
            node = int(node)
        except (TypeError, ValueError):
            return empty
        vocab = F.token_vocab(steps[max(0, index - 50) : index + 1])
        return {view.inspector: F.node_inspector_html(steps[index], node, vocab),
                view.acceptance: F.acceptance_figure(steps[index], node, vocab=vocab)}

    return inspect


def make_nudge(view: DecodeView, delta: int) -> Callable[[Session], dict[Any, Any]]:
    def nudge(session: Session) -> dict[Any, Any]:
        session.sent = {}
        if delta == 0:  # "latest": follow the run again
            session.follow = True
            return view.step_updates(session, len(session.steps) - 1)
        session.follow = False
        return view.step_updates(session, session.clamp(session.shown + delta))

    return nudge
