"""The page: the header and notices, the control panel shared by every tab (``panel``), the
tabs, each built and wired by its own module (``build_<tab>_tab``: ``decode_tab``, ``compare_tab``,
``explorer_tab``, ``lessons_tab``, ``serve_tab``), and the few events that
span the page: Stop, which stops whatever the session runs, and the opening recording. Every event
that runs no model skips the queue (``outside_queue``): Gradio counts every waiting event against
the queue's size, so otherwise a queue full of runs would turn away page loads, the slider, the
walk and Stop. What may work for a while among them (an atlas, a trace or a sweep replayed, every
public endpoint) is held to the model-free limit and budget (``talon.ui.session.bounded``,
``talon.atlas.budget``), and the door (``talon.ui.door``) paces the rest while a model runs, so that
callers who need no model cannot take the host from the runs."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import gradio as gr

from talon import figures as F
from talon.atlas.budget import GATE
from talon.server.facade import load_examples, pair_status, server_notices
from talon.settings import Settings
from talon.ui.compare_tab import build_compare_tab
from talon.ui.decode_handlers import make_show_recording
from talon.ui.decode_tab import build_decode_tab
from talon.ui.decode_view import DecodeView
from talon.ui.explorer_tab import build_explorer_tab
from talon.ui.lessons_tab import build_lessons_tab, make_export, make_refresh
from talon.ui.panel import MODEL_CONCURRENCY_ID, build_controls
from talon.ui.recording import recording_controls
from talon.ui.serve_tab import build_serve_tab
from talon.ui.session import Session, refused_slowly, stop
from talon.ui.words import HEADER


def open_page(view: DecodeView, prompt: gr.Textbox, components: dict[str, Any]) -> Callable[[Session], dict]:
    """At page load: the shipped recording, and the prompt box and controls it was made with (so
    Run repeats it), in one update. As two events, the controls' could land after the recording's,
    over a prompt the visitor had typed since: on a busy host a test's typed prompt was replaced by
    the recording's 3,279-token one."""
    show, controls = make_show_recording(view), recording_controls(prompt, components)

    def opened(session: Session) -> dict:
        updates = show(session)
        return {**updates, **controls()} if updates else updates  # nothing shown (a run came first): nothing set

    return opened


def theme() -> gr.themes.Base:
    """Local fonts only: the app must work offline."""
    return gr.themes.Soft(
        primary_hue="blue",
        neutral_hue="slate",
        font=[gr.themes.Font(name) for name in ("Inter", "Segoe UI", "system-ui", "sans-serif")],
        font_mono=[
            gr.themes.Font(name) for name in ("JetBrains Mono", "ui-monospace", "Menlo", "Consolas", "monospace")
        ],
    )


def build_ui(settings: Settings) -> gr.Blocks:
    """The whole app. Pass css/head/theme to ``launch()`` (Gradio 6)."""
    examples = load_examples()
    with gr.Blocks(title="Talon: tree speculative decoding, step by step", delete_cache=(3600, 3600)) as demo:
        gr.HTML(HEADER)
        for notice in server_notices():
            gr.HTML(f'<div class="talon-notice">{F.esc(notice)}</div>')
        models = gr.HTML(models_status(), elem_id="talon-models-status")
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=300, elem_id="talon-controls"):
                panel = build_controls(settings, examples)
            with gr.Column(scale=3, min_width=480), gr.Tabs():
                with gr.Tab("Decode", id="decode"):
                    decode = build_decode_tab(panel, settings)
                with gr.Tab("Compare", id="compare"):
                    compare = build_compare_tab(panel, settings)
                with gr.Tab("Threshold explorer", id="explorer"):
                    explorer = build_explorer_tab(panel, settings)
                with gr.Tab("Serve it", id="serve"):
                    build_serve_tab(panel, settings, explorer.state)
                with gr.Tab("Lessons", id="lessons") as lessons_tab:
                    lessons = build_lessons_tab(explorer.state, decode.state)
        lesson_inputs = [lessons.prompt, lessons.budget, explorer.state]
        # the first opening computes every lesson (seconds): its figures show that they are coming
        lessons_tab.select(make_refresh(), [*lesson_inputs, decode.state], [lessons.prompt, *lessons.outputs()],
                           api_visibility="private", show_progress="minimal")
        lessons.export.click(make_export(), [decode.state, *lesson_inputs], lessons.download,
                             api_visibility="private", concurrency_limit=2)
        panel.stop.click(stop, [decode.state, compare.state], None, concurrency_limit=None, api_visibility="private")
        demo.load(open_page(decode, panel.prompt, panel.components), [decode.state],
                  [*decode.outputs(), panel.prompt, *panel.components.values()], api_visibility="private",
                  concurrency_limit=None, show_progress="hidden")
        # every open page hears what the models are doing: loading, ready, switched by a visitor
        demo.load(models_status, None, models, api_visibility="private", show_progress="hidden")
        gr.Timer(STATUS_EVERY_S).tick(models_status, None, models, api_visibility="private", show_progress="hidden")
    GATE.configure(settings.light_limit, settings.light_cpu_s)
    outside_queue(demo)
    return demo


STATUS_EVERY_S = 3.0


def models_status() -> str:
    return f'<div class="talon-models-status">{F.esc(pair_status())}</div>'


def outside_queue(demo: gr.Blocks) -> None:
    """Take every event that runs no model out of the queue (they answer at once, while runs
    wait). Only the queue streams a generator, so one outside the model group is a wiring error; so
    is a public endpoint (anyone may call it in a loop) not held to the model-free limit."""
    for fn in demo.fns.values():
        if fn.concurrency_id == MODEL_CONCURRENCY_ID or fn.fn is None:
            continue
        if inspect.isgeneratorfunction(fn.fn):
            raise TypeError(f"{fn.name} streams, so it needs the queue: give it the model group or stop its yields")
        if getattr(fn.fn, "bounded", None):
            fn.fn = refused_slowly(fn.fn)
        elif fn.api_visibility == "public":
            raise TypeError(f"{fn.name} is public and runs no model: hold it to the limit (talon.ui.session.bounded)")
        fn.queue = False
