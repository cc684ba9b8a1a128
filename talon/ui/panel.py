"""The control panel shared by every tab (the prompt, the examples, the drafter, tree, sampling
and run controls), and how a tab wires a button that runs a model: one shared queue."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from talon.examples import Example
from talon.run_config import TREE_MODES
from talon.settings import Settings
from talon.ui.backend import initial_preset, presets
from talon.ui.controls import UI_DRAFTERS, Controls

MODEL_CONCURRENCY_ID = "model"


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


def build_controls(settings: Settings, examples: list[Example]) -> ControlPanel:
    prompt = gr.Textbox(label="Prompt", value=examples[0].prompt, lines=6, max_lines=14, elem_id="talon-prompt")
    picker = gr.Dropdown(
        label="Example prompts (SpecBench suites)",
        choices=[(ex.label, i) for i, ex in enumerate(examples)],
        value=None,
        elem_id="talon-examples",
    )
    picker.input(
        lambda i: examples[int(i)].prompt if i is not None else gr.skip(), picker, prompt, api_visibility="private"
    )
    with gr.Row():
        run = gr.Button("Run", variant="primary", elem_id="talon-run")
        stop = gr.Button("Stop", variant="stop", elem_id="talon-stop")
    defaults, limit = Controls(), settings.max_new_tokens_limit
    offered, initial = presets(settings), initial_preset(settings)
    c: dict[str, Any] = {}
    with gr.Accordion("Drafter and tree", open=True):
        c["preset"] = gr.Dropdown(label="Models", choices=[(p.label, p.key) for p in offered], value=initial)
        c["drafter"] = gr.Radio(label="Drafter", choices=list(UI_DRAFTERS), value=defaults.drafter)
        c["tree_mode"] = gr.Radio(label="Tree", choices=list(TREE_MODES), value=defaults.tree_mode)
        c["budget"] = gr.Slider(1, 128, value=defaults.budget, step=1, label="Budget N (nodes verified per step)")
        c["root_k"] = gr.Slider(1, 16, value=defaults.root_k, step=1, label="Root K (children of the root)")
        c["top_k"] = gr.Slider(1, 8, value=defaults.top_k, step=1, label="k (children per expanded node)")
        c["mu"] = gr.Slider(0.0, 1.0, value=defaults.mu, step=0.01, label="Gate μ (expand if c ≥ μ × layer max)")
        c["max_depth"] = gr.Slider(1, 32, value=defaults.max_depth, step=1, label="Max depth")
        c["min_conf"] = gr.Slider(
            0.0, 1.0, value=defaults.min_conf, step=0.01, label="Min confidence (stop deepening below it; 0 = off)"
        )
        c["retrieval_threshold"] = gr.Slider(
            1, 16, value=defaults.retrieval_threshold, step=1, label="Retrieval threshold (match length to graft)"
        )
    with gr.Accordion("Sampling and length", open=False):
        c["temperature"] = gr.Slider(0.0, 2.0, value=defaults.temperature, step=0.05, label="Temperature (0 = greedy)")
        c["top_p"] = gr.Slider(0.05, 1.0, value=defaults.top_p, step=0.05, label="Top-p")
        c["seed"] = gr.Number(value=defaults.seed, precision=0, label="Seed", minimum=0)
        c["max_new_tokens"] = gr.Slider(
            1, limit, value=min(defaults.max_new_tokens, limit), step=1, label="Max new tokens"
        )
    c["cost_aware"] = gr.Checkbox(
        value=defaults.cost_aware,
        label="Cost-aware (stop the tree when the next layer does not pay on this hardware; skip the "
        "draft model when retrieval alone is faster)",
        elem_id="talon-cost-aware",
    )
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
    c["async_draft"] = gr.Checkbox(
        value=defaults.async_draft, label="Async drafting (draft the next tree while verifying)",
        info="Off by default, because it measured slower: on a CPU the pre-draft takes the verifier's cores; on a "
        "GPU an in-line draft layer is a CUDA-graph replay (about 3 ms on an H100) while a pre-draft runs eagerly "
        "on its own thread (about 15 ms). The output is the target's either way.",
    )
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
