"""The control panel shared by every tab (the prompt, the examples, the drafter, tree, sampling
and run controls), and how a tab wires a button that runs a model: one shared queue."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from talon import figures as F
from talon.knobs import ASYNC_OFF_WHY, BY_APP, Knob
from talon.server.facade import (
    Example,
    drafter_choices,
    initial_preset,
    preset_label,
    switch_policy,
    unoffered,
    visitor_presets,
)
from talon.settings import Settings

MODEL_CONCURRENCY_ID = "model"
MODELS_INFO_CPU = "target + draft (larger pairs appear on a server with a GPU)"
MODELS_INFO = "target + draft; choosing another pair loads it, after the running work, for every visitor"
MODELS_INFO_OWNER = "target + draft: this Space runs one pair, which its owner picks (TALON_PRESET)"


def models_info(settings: Settings, offered: int) -> str:
    """The Models menu's line: who picks the pair, and which pairs this server cannot hold, with why."""
    info = MODELS_INFO_OWNER if switch_policy(settings) == "owner" else MODELS_INFO if offered > 1 else MODELS_INFO_CPU
    refused = "; ".join(f"{preset_label(p, settings)}: {why}" for p, why in unoffered(settings))
    return f"{info}. Not offered here: {refused}" if refused else info


def queue_limits(settings: Settings) -> tuple[int, int]:
    """(default_concurrency_limit, max_size) for the queue."""
    return settings.queue_concurrency, settings.queue_max_size


@dataclass
class ControlPanel:
    """The input components shared by every tab: the prompt and the run controls."""

    prompt: gr.Textbox
    components: dict[str, Any]  # Controls field -> component
    compare_ar: gr.Checkbox
    step_through: gr.Checkbox
    run: gr.Button
    stop: gr.Button


# the knobs' controls, in the panel's order (talon.knobs: label, range, default)
DRAFTER_AND_TREE = ("drafter", "tree_mode", "budget", "root_k", "top_k", "mu", "max_depth", "min_conf",
                    "retrieval_threshold", "skip_layers")
SAMPLING_AND_LENGTH = ("temperature", "top_p", "seed", "max_new_tokens")
DRAFTER_INFO = ("hybrid: the draft model's tree with retrieval grafted in; layerskip: the target drafts for itself "
                "with a middle block of its layers skipped (its nodes show as the draft model's)")
ASYNC_WHY = f"Off by default, because {ASYNC_OFF_WHY}. The output is the target's either way."


def control(knob: Knob, limit: int | None = None, **options: Any) -> Any:
    """The component of one knob of the table: a radio for a choice, a checkbox for a switch, a
    slider over its app range (``limit``: the server's cap on an open range), a number box else;
    ``options`` (a shorter label, fewer choices, an elem_id) go to the component."""
    given = {"label": knob.label, "value": knob.default, **options}
    if knob.kind == "choice":
        return gr.Radio(**{"choices": list(knob.app_choices or knob.choices), **given})
    if knob.kind == "bool":
        return gr.Checkbox(**given)
    if knob.slider is None and limit is None:
        return gr.Number(**{"precision": 0, "minimum": knob.lo, **given})
    lo, hi, step = knob.slider or (knob.lo, limit, 1)
    return gr.Slider(lo, hi, step=step, **{**given, "value": min(given["value"], hi)})


def follow_preset(preset: Any, drafter: Any, settings: Settings) -> None:
    """A drafter radio offers what the picked pair can draft with: a draft model's kinds, or an
    EAGLE-3 head's where the pair's draft slot holds one (hybrid becomes eagle3-hybrid)."""
    def offer(key: str, current: str) -> Any:
        kinds, kind = drafter_choices(settings, key, current)
        return gr.update(choices=list(kinds), value=kind)

    preset.change(offer, [preset, drafter], drafter, api_visibility="private")


def build_controls(settings: Settings, examples: list[Example]) -> ControlPanel:
    prompt = gr.Textbox(label="Prompt", value=examples[0].prompt, lines=6, max_lines=14, elem_id="talon-prompt")
    picker = gr.Dropdown(
        label="Example prompts (SpecBench suites)",
        choices=[(ex.label, i) for i, ex in enumerate(examples)],
        value=None,
        info="six kinds of task; a pick replaces the prompt above",
        elem_id="talon-examples",
    )
    picker.input(
        lambda i: examples[int(i)].prompt if i is not None else gr.skip(), picker, prompt, api_visibility="private"
    )
    with gr.Row():
        run = gr.Button("Run", variant="primary", elem_id="talon-run")
        stop = gr.Button("Stop", variant="stop", elem_id="talon-stop")
    limit = settings.max_new_tokens_limit
    offered, initial = visitor_presets(settings), initial_preset(settings)
    c: dict[str, Any] = {}
    with gr.Accordion("Drafter and tree", open=True):
        c["preset"] = gr.Dropdown(label="Models", choices=[(preset_label(p, settings), p.key) for p in offered],
                                  value=initial, info=models_info(settings, len(offered)),
                                  interactive=len(offered) > 1)
        kinds, kind = drafter_choices(settings, initial, BY_APP["drafter"].default)
        for name in DRAFTER_AND_TREE:
            drafter = {"info": DRAFTER_INFO, "choices": list(kinds), "value": kind} if name == "drafter" else {}
            c[name] = control(BY_APP[name], **drafter)
        follow_preset(c["preset"], c["drafter"], settings)
    with gr.Accordion("Sampling and length", open=False):
        for name in SAMPLING_AND_LENGTH:
            c[name] = control(BY_APP[name], limit if name == "max_new_tokens" else None)
    c["cost_aware"] = control(BY_APP["cost_aware"], elem_id="talon-cost-aware")
    c["draft_quant"] = gr.Radio(
        label="Draft weights",
        choices=[("server default", "auto"), ("bf16/fp32", "none"), ("int8 (CPU)", "int8")],
        value="auto",
        info="int8 makes the draft's forwards cheaper on a CPU; the output stays the target's",
    )
    c["target_weights"] = gr.Radio(
        label="Target weights",
        choices=[("server default", "auto"), ("dense", "dense"), ("int4 (CPU)", "int4")],
        value="auto",
        info="int4 streams a quarter of the bytes per step on a CPU: plain decoding about 2x faster, trees "
        "not (its kernel takes a row at a time); the packed model is the target",
    )
    c["async_draft"] = control(BY_APP["async_draft"], info=ASYNC_WHY)
    compare_ar = gr.Checkbox(value=False, label="Compare with autoregressive (runs the prompt again without drafts)")
    step_through = gr.Checkbox(value=False, label="Step-through: reveal the run one step per click")
    return ControlPanel(prompt=prompt, components=c, compare_ar=compare_ar, step_through=step_through, run=run,
                        stop=stop)


def model_event(settings: Settings) -> dict[str, Any]:
    """Listener options of every event that runs a model: one shared concurrency group."""
    return dict(
        concurrency_id=MODEL_CONCURRENCY_ID, concurrency_limit=queue_limits(settings)[0], show_progress="minimal"
    )


def run_on_click(button: gr.Button, fn: Callable[..., Any], panel: ControlPanel, extra: dict[str, Any],
                 outputs: list[Any], api_name: str, settings: Settings) -> None:
    """Wire a tab's run button: the prompt and every control in, the tab's outputs out, queued
    like a model run."""
    button.click(fn, inputs=[panel.prompt], inputs_kwargs={**panel.components, **extra}, outputs=outputs,
                 api_name=api_name, **model_event(settings))


def waiting_plot(message: str, height: int = 220, **kwargs: Any) -> gr.Plot:
    """A plot that says, until its first figure comes, what will draw it (not a blank box)."""
    return gr.Plot(value=F.empty_figure(message, height), show_label=False, **kwargs)
