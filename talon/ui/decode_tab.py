"""The Decode tab: its layout (the figures' rows, the buttons) and its wiring (the events). What it
shows: ``talon.ui.decode_view.DecodeView``; what its events run: ``talon.ui.decode_handlers``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from talon import figures as F
from talon.settings import Settings
from talon.ui.decode_handlers import (
    make_generate,
    make_inspect,
    make_nudge,
    make_open_sampled,
    make_replay,
    make_show_step,
)
from talon.ui.decode_view import DecodeView
from talon.ui.panel import ControlPanel, model_event
from talon.ui.session import Session, sessionless
from talon.ui.walk_panel import WalkView, full_tree_button, make_offer_full_tree, walk_panel, wire_walk
from talon.ui.words import EXPLAIN, TEXT_LEGEND


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
