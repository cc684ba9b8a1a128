"""The Threshold explorer tab's layout and wiring: its knobs (the knob table's, with short labels),
the panel, the events; its behaviour (the view and the handlers) is ``explorer_view``."""

from __future__ import annotations

from typing import Any

import gradio as gr

from talon import figures as F
from talon.atlas.explorer import EXPLORED_DRAFTERS, AtlasSession, Knobs
from talon.knobs import KNOB
from talon.settings import Settings
from talon.ui.explorer_words import atlas_words, greedy_note
from talon.ui.measure_view import build_measure_panel
from talon.ui.explorer_view import (
    ExplorerView,
    make_apply,
    make_record,
    make_rescore,
    make_show_step,
    make_to_best,
    make_upload,
)
from talon.ui.panel import ControlPanel, control, run_on_click
from talon.ui.words import EXPLAIN


EXPLORER_ROWS = (  # knob -> (short label, elem_id suffix), row by row
    {"drafter": ("Drafter", "drafter"), "tree": ("Tree", "tree"), "cost_aware": ("Cost-aware planning", "cost-aware")},
    {"budget": ("Budget N", "budget"), "root_k": ("Root K", "root-k"), "top_k": ("k per node", "top-k"),
     "mu": ("Gate μ", "mu")},
    {"max_depth": ("Max depth", "depth"), "min_conf": ("Min confidence", "min-conf"),
     "retrieval_min_match": ("Retrieval min match", "min-match"), "graft_threshold": ("Graft threshold", "graft")},
)


def knob_components() -> dict[str, Any]:
    """The explorer's knobs (the knob table's, under their one name), with short labels."""
    c: dict[str, Any] = {}
    for row in EXPLORER_ROWS:
        with gr.Row():
            for name, (label, elem) in row.items():
                extra = {"choices": list(EXPLORED_DRAFTERS)} if name == "drafter" else {}
                c[name] = control(KNOB[name], label=label, elem_id=f"talon-atlas-{elem}", **extra)
    return c


def explorer_panel() -> ExplorerView:
    """The atlas explorer's components (call inside the Threshold explorer tab)."""
    note = gr.HTML("", elem_id="talon-atlas-note")
    with gr.Row(equal_height=True):
        record = gr.Button("Record an atlas of this prompt (runs the models once)", variant="primary", scale=2,
                           elem_id="talon-atlas-record")
        upload = gr.File(label="…or load an atlas (JSON)", file_types=[".json"], scale=1, height=90,
                         elem_id="talon-atlas-upload")
        download = gr.File(label="Download this atlas", interactive=False, scale=1, height=90,
                           elem_id="talon-atlas-download")
    status = gr.HTML(atlas_words(None), elem_id="talon-atlas-status")
    gr.Markdown("#### Knobs: every move replays the atlas (greedy, no model)")
    knobs = knob_components()
    score = gr.HTML(F.atlas_score_html(None), elem_id="talon-atlas-score")
    with gr.Row():
        to_best = gr.Button("★ Move the knobs to the best", size="sm", elem_id="talon-atlas-to-best")
        apply_knobs = gr.Button("Apply the knobs to the controls ←", size="sm", elem_id="talon-atlas-apply")
        apply_best = gr.Button("Apply the best to the controls ←", size="sm", elem_id="talon-atlas-apply-best")
    with gr.Row():
        mu_mat = gr.Plot(show_label=False, elem_id="talon-atlas-mu-mat")
        mu_speed = gr.Plot(show_label=False, elem_id="talon-atlas-mu-speed")
    with gr.Row():
        k_mat = gr.Plot(show_label=False, elem_id="talon-atlas-k-mat")
        k_speed = gr.Plot(show_label=False, elem_id="talon-atlas-k-speed")
    pareto_plot = gr.Plot(show_label=False, elem_id="talon-atlas-pareto")
    gr.Markdown("#### A replayed step of the knobs' configuration")
    step = gr.Slider(0, 1, value=0, step=1, label="Replayed step", elem_id="talon-atlas-step")
    caption = gr.HTML(F.step_caption_html([], 0), elem_id="talon-atlas-caption")
    with gr.Row():
        tree = gr.Plot(show_label=False, scale=3, elem_id="talon-atlas-tree")
        gates = gr.Plot(show_label=False, scale=2, elem_id="talon-atlas-gates")
    return ExplorerView(record=record, upload=upload, download=download, note=note, status=status, knobs=knobs,
                        score=score, to_best=to_best, apply_knobs=apply_knobs, apply_best=apply_best, mu_mat=mu_mat,
                        mu_speed=mu_speed, k_mat=k_mat, k_speed=k_speed, pareto=pareto_plot, step=step,
                        caption=caption, tree=tree, gates=gates, state=gr.State(AtlasSession()))


def wire_explorer(view: ExplorerView, components: dict[str, Any], prompt: Any = None) -> None:
    """Every handler but Record (a model run, wired with the other tabs' run buttons); ``components``
    are the left panel's controls, ``prompt`` its prompt box (Apply sets it to the atlas's)."""
    quick = dict(concurrency_limit=None, show_progress="hidden")
    knob_inputs = {**view.knobs, "atlas_state": view.state}
    rescore = make_rescore(view)
    for name, component in view.knobs.items():
        component.input(rescore, inputs_kwargs={**knob_inputs, "step": view.step}, outputs=view.score_outputs(),
                        trigger_mode="always_last", api_name="atlas_score" if name == "mu" else None,
                        api_visibility="public" if name == "mu" else "private", **quick)
    view.step.input(make_show_step(view), [view.step, view.state], [view.step, view.caption, view.tree, view.gates],
                    trigger_mode="always_last", api_visibility="private", **quick)
    view.upload.upload(make_upload(view), inputs=[view.upload], inputs_kwargs=knob_inputs,
                       outputs=[view.status, *view.score_outputs()], api_name="load_atlas", **quick)
    view.to_best.click(make_to_best(view), inputs_kwargs=knob_inputs,
                       outputs=[*view.knobs.values(), *view.score_outputs()], api_visibility="private", **quick)
    apply_outputs = [*(components[name] for name in Knobs().controls()), components["max_new_tokens"],
                     components["temperature"], view.status] + ([prompt] if prompt is not None else [])
    view.apply_knobs.click(make_apply(view, components, best=False, prompt=prompt), inputs_kwargs=knob_inputs,
                           outputs=apply_outputs, api_visibility="private", **quick)
    view.apply_best.click(make_apply(view, components, best=True, prompt=prompt), inputs_kwargs=knob_inputs,
                          outputs=apply_outputs, api_visibility="private", **quick)
    components["temperature"].change(greedy_note, components["temperature"], view.note, api_visibility="private",
                                     **quick)


def build_explorer_tab(panel: ControlPanel, settings: Settings) -> ExplorerView:
    """The Threshold explorer tab, built and wired (call inside the tab): the atlas explorer, then
    the measured part."""
    gr.Markdown(EXPLAIN["explorer"], elem_classes=["talon-explain"])
    view = explorer_panel()
    record_extra = {"atlas_state": view.state, "min_match": view.knobs["retrieval_min_match"]}
    run_on_click(view.record, make_record(view, settings), panel, record_extra, view.all_outputs(),
                 "record_atlas", settings)
    wire_explorer(view, panel.components, panel.prompt)
    build_measure_panel(panel, settings)
    return view
