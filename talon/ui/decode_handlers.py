"""The Decode tab's handlers: run (with the optional autoregressive baseline), open a shipped
recording, replay a trace file, move the step slider, Prev / Next / Latest, inspect a node. Each
``make_*`` returns the function an event calls, over the tab's ``DecodeView``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gradio as gr

from talon import figures as F
from talon.atlas.budget import checkpoint
from talon.figures.opening import RECORDING, SAMPLED_RECORDING, opening_step
from talon.run_config import ConfigError
from talon.server.facade import Controls, RunRequest, decode_all, start_status, user_error, wait_for_pair
from talon.settings import Settings
from talon.trace import StepTrace, TraceFileError, parse_trace, read_json_upload
from talon.ui.decode_view import DecodeView, step_vocab
from talon.ui.files import upload_path, write_trace
from talon.ui.recording import RECORDING_NOTE, SAMPLED_NOTE, load_recording
from talon.ui.session import Session, bounded
from talon.ui.stream import stream_run

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


def make_replay(view: DecodeView) -> Callable[[Any, Session], dict[Any, Any]]:
    @bounded("replaying the trace")
    def replay(trace_file: Any, session: Session) -> dict[Any, Any]:
        """Load a downloaded trace (talon-trace/1 JSON) and re-plot every figure, no model needed."""
        if not trace_file:
            raise gr.Error("no file: upload a trace JSON downloaded from this app")
        try:
            summary, steps = parse_trace(read_json_upload(upload_path(trace_file)), tick=checkpoint)
        except (TraceFileError, OSError) as error:
            raise user_error(f"cannot replay this trace: {error}") from error
        session.begin(step_through=False, cancel=None)
        session.steps, session.summary = steps, summary
        updates = final_updates(view, session)
        updates[view.summary] = F.summary_html(summary, steps, None, f"replayed trace of {len(steps)} steps")
        return updates

    return replay


def first_chance_step(steps: list[StepTrace]) -> int:
    """A sampled run's first step whose draft the target rejected by chance (else the opening step)."""
    chance = [i for i, st in enumerate(steps) if st.bonus_kind == "resampled" and st.accept_len]
    return chance[0] if chance else opening_step(steps)


def make_open_recording(view: DecodeView, path: Path, note: str, first_step: Callable[[list[StepTrace]], int],
                        asked: bool) -> Callable[[Session], dict[Any, Any]]:
    """Open a shipped recording on ``first_step``, so every figure, the slider and the inspector work
    with no model: at page load (``asked`` False: quietly nothing where a run came first or the
    copy ships none) or on a button (``asked``: those are errors the user sees)."""
    def open_recording(session: Session) -> dict[Any, Any]:
        running = session.cancel is not None and session.summary is None
        if not asked and (session.steps or session.cancel is not None):  # a run came first
            return {}
        if running:
            raise user_error("a run is in progress: press Stop first, then open the recording")
        recording = load_recording(path)
        if recording is None:
            if not asked:
                return {}
            raise user_error("this recording is not shipped with this copy of the app")
        summary, steps = recording
        session.begin(step_through=False, cancel=None)
        session.steps, session.summary = list(steps), summary
        updates = final_updates(view, session, write=False)
        session.follow = False
        updates.update(view.step_updates(session, first_step(steps)))
        updates[view.summary] = F.summary_html(summary, session.steps, None, note)
        return updates

    return open_recording


def make_show_recording(view: DecodeView) -> Callable[[Session], dict[Any, Any]]:
    """At page load: the shipped recording of the default pair, on the step that shows the most."""
    return make_open_recording(view, RECORDING, RECORDING_NOTE, opening_step, asked=False)


def make_open_sampled(view: DecodeView) -> Callable[[Session], dict[Any, Any]]:
    """The button's: the shipped sampled recording, on its first draft rejected by chance."""
    return make_open_recording(view, SAMPLED_RECORDING, SAMPLED_NOTE, first_chance_step, asked=True)


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
        vocab = step_vocab(steps, index)
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
