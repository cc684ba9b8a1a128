"""The Blocks layout and its wiring: the header and explanations, the theme, the control panel
shared by every tab, the Decode, Compare and Threshold explorer tabs, and ``build_ui``. The
tabs' behaviour lives in ``decode_view``, ``compare_view`` and ``sweep_view``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from talon import figures as F
from talon.examples import Example, load_examples
from talon.run_config import TREE_MODES
from talon.settings import Settings
from talon.ui.atlas_view import AtlasView, atlas_panel, make_record, wire_atlas
from talon.ui.backend import initial_preset, presets, server_notices
from talon.ui.compare_view import CompareView, compare_summary_html, make_compare
from talon.ui.controls import UI_DRAFTERS, Controls
from talon.ui.decode_view import (
    DecodeView,
    make_generate,
    make_inspect,
    make_nudge,
    make_replay,
    make_show_recording,
    make_show_step,
    recording_controls,
)
from talon.ui.serving_view import make_serving_config
from talon.ui.session import CompareSession, Session, stop
from talon.ui.sweep_view import (
    SweepView,
    make_filter_sweep,
    make_load_sweep,
    make_sweep,
)
from talon.ui.walk_view import (
    WalkView,
    full_tree_button,
    make_offer_full_tree,
    walk_panel,
    wire_walk,
)

MODEL_CONCURRENCY_ID = "model"


def queue_limits(settings: Settings) -> tuple[int, int]:
    """(default_concurrency_limit, max_size) for the queue."""
    return settings.queue_concurrency, settings.queue_max_size


# ---------------------------------------------------------------------------------------------
# Layout
# ---------------------------------------------------------------------------------------------

HEADER = """
<div class="talon-header">
  <h1>Talon <span>tree speculative decoding, one step at a time</span></h1>
  <p>A small <b>drafter</b> (a draft model and/or retrieval from the text so far) proposes a
  <b>tree</b> of possible next tokens; the big <b>target</b> model checks the whole tree in one
  forward pass and keeps the longest path it agrees with, plus one token of its own (the
  <b>bonus</b>). The output is exactly what the target alone would write, only faster.</p>
</div>
"""

TEXT_LEGEND = """
<div class="talon-legend">
  <span class="tk src-model">draft model</span>
  <span class="tk src-retrieval">retrieval</span>
  <span class="tk src-both">model + retrieval</span>
  <span class="tk src-bonus">target's bonus token</span>
  <span class="tk src-resampled">target's token after a rejection</span>
  <span class="legend-note">│ separates steps · hover a token for its step and probabilities ·
  ←/→ keys step through</span>
</div>
"""

EXPLAIN: dict[str, str] = {
    "tree": (
        "**Draft tree.** Left to right = tokens ahead of the text. Colour: who drafted the token "
        "(blue model, orange retrieval, purple both). **Bold ring**: accepted by the target. "
        "**Faded**: rejected, or never reached because an ancestor was rejected. **⊗**: gated out, "
        "too unsure to expand. **★**: the bonus token the target adds after a fully accepted path; "
        "**◆**: the token it puts in place of a rejected draft (resampled). Hover a node for q "
        "(drafter probability), c (path confidence), its position id and the target's top 5; the "
        "**Node inspector** below holds the full table."
    ),
    "gates": (
        "**Confidence gates.** Each dot is a candidate of one layer; height = its path confidence "
        "c (product of q along the path, log scale). Dashed line: the layer's threshold μ × max. "
        "Above it the node proposes children; below it is gated out. Small μ: wide, shallow trees; "
        "large μ: narrow, deep ones."
    ),
    "cost": (
        "**Cost model.** Left: what verification (green, by tree nodes) and one draft layer (blue, "
        "by frontier width) cost on this machine, measured at first use and refined by every "
        "step; dots are this run's steps. Right: for the chosen step, the expected tokens per "
        "second had the tree been cut to its best n nodes; ◆ is what was verified, ★ where it "
        "peaks. On a CPU the peak comes early; on a GPU the curve stays flat and trees grow."
    ),
    "serve": (
        "**Run it in a server.** The controls on the left as the nearest SGLang launch flags and "
        "vLLM `--speculative-config`, checked against the engines' source at the versions named. "
        "What has no equivalent there (the adaptive gate, the hybrid graft of retrieval into the "
        "model's tree, async pre-drafting, cost-aware planning) is listed plainly. Both engines "
        "report acceptance as *mean acceptance length* and *per-position acceptance rate*: Talon's "
        "traces and benchmark results carry the same numbers (`serving_metrics`)."
    ),
    "inspector": (
        "**Node inspector.** For the chosen node: the target's top 5 at its place (the drafted "
        "token marked), the verdict, its position id and, under sampling, the acceptance "
        "probability; for an accepted node, what the target would write next. **Near-tie**: two "
        "tokens closer than a bf16 rounding step, where bf16 and float32 runs can part ways."
    ),
    "mask": (
        "**Tree attention mask.** The target checks every node in one forward. Row i shows what "
        "token i may attend to: itself and its ancestors (and all committed text, not drawn), so "
        "each branch sees only its own path. Dark row: the accepted path. Each row is labelled "
        "node:token @position id: a node's position is the text length plus its depth, so "
        "siblings share one (they are alternatives for the same place); only the mask tells them apart."
    ),
    "timeline": (
        "**Timeline.** When the drafter and the target (verifier) are busy, in ms. Synchronous "
        "decoding takes turns; with *async* on, the drafter pre-drafts the next tree while the "
        "target verifies, so the bars overlap."
    ),
    "per_step": (
        "**Tokens per step.** Each bar is one target forward: the accepted drafts by source plus the "
        "bonus token. The line is the running mean, MAT; plain decoding has MAT = 1."
    ),
    "by_depth": (
        "**Acceptance by depth.** Of the steps whose tree reached depth d, how many had their accepted "
        "path reach d. It falls with depth: every extra token must match too."
    ),
    "sources": "**Sources.** Which drafter produced the committed tokens; the bonus token is the target's own.",
    "speed": "**Tokens per second.** Per step (bars) and overall (line). Compare with autoregressive in the summary.",
    "compare": (
        "**Compare.** Runs configuration A (the controls on the left) and B (A with the changes "
        "below) on the same prompt, one after the other. Greedy decoding writes the same text in "
        "both; what differs is how many target forwards it takes."
    ),
    "sweep": (
        "**Threshold explorer.** *Record an atlas* of the prompt on the left: the models run once (a "
        "greedy run, then the draft's proposals around its text). From then on every knob below "
        "replays any greedy configuration exactly, with no model, in milliseconds: MAT is what a run "
        "would accept, tokens/s and step time are predicted by the atlas's cost model of this "
        "hardware. The heatmaps vary two knobs around the others (□ the knobs, ★ the best by "
        "predicted tokens/s; * marks a cell that asked for more drafts than the atlas holds), the "
        "Pareto chart weighs MAT against step time, and **Apply** sets the controls on the left."
    ),
    "real_sweep": (
        "Short real runs of the current prompt for each gate μ and budget N (other knobs from the "
        "left; slow: one run per cell), or the `results.json` of `python -m talon.bench --sweep`. "
        "MAT rewards big trees; tokens/s shows what they cost."
    ),
}


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


@dataclass
class ControlPanel:
    """The input components shared by every tab: the prompt and the run controls."""

    prompt: gr.Textbox
    components: dict[str, Any]  # Controls field -> component
    compare_ar: gr.Checkbox
    step_through: gr.Checkbox
    run: gr.Button
    stop: gr.Button


def _controls(settings: Settings, examples: list[Example]) -> ControlPanel:
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
    c["async_draft"] = gr.Checkbox(
        value=defaults.async_draft, label="Async drafting (draft the next tree while verifying)"
    )
    compare_ar = gr.Checkbox(value=False, label="Compare with autoregressive (runs the prompt again without drafts)")
    step_through = gr.Checkbox(value=False, label="Step-through: reveal the run one step per click")
    return ControlPanel(prompt, c, compare_ar, step_through, run, stop)


def _figure_row(key: str, label: str) -> gr.Plot:
    with gr.Row(equal_height=False):
        plot = gr.Plot(
            label=label, show_label=False, scale=3, min_width=420, elem_classes=["talon-plot"], elem_id=f"talon-{key}"
        )
        gr.Markdown(EXPLAIN[key], elem_classes=["talon-explain"], min_width=200)
    return plot


def _run_plot(key: str, label: str) -> gr.Plot:
    """A run-level figure with its explanation below it, half a row wide."""
    with gr.Column(min_width=320):
        plot = gr.Plot(label=label, show_label=False, elem_id=f"talon-{key.replace('_', '-')}")
        gr.Markdown(EXPLAIN[key], elem_classes=["talon-explain"])
    return plot


def decode_tab() -> tuple[DecodeView, WalkView, dict[str, gr.Button]]:
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
    tree = _figure_row("tree", "Draft tree")
    with gr.Row(equal_height=False, elem_id="talon-inspector-row"):
        with gr.Column(scale=3, min_width=420):
            node_pick = gr.Dropdown(label="Node inspector: pick a node of this step", choices=[], value=None,
                                    elem_id="talon-node-pick")
            inspector = gr.HTML(F.node_inspector_html_empty(), elem_id="talon-inspector")
        gr.Markdown(EXPLAIN["inspector"], elem_classes=["talon-explain"], min_width=200)
    gates = _figure_row("gates", "Confidence gates")
    mask = _figure_row("mask", "Attention mask")
    timeline = _figure_row("timeline", "Timeline")
    cost = _figure_row("cost", "Cost model")
    gr.Markdown("### The whole run")
    with gr.Row():
        per_step = _run_plot("per_step", "tokens per step")
        by_depth = _run_plot("by_depth", "acceptance by depth")
    with gr.Row():
        sources = _run_plot("sources", "sources")
        speed = _run_plot("speed", "tokens per second")
    with gr.Row():
        download = gr.File(label="Download the trace (JSON)", interactive=False, elem_id="talon-download")
        upload = gr.File(label="Replay a trace (no model needed)", file_types=[".json"], elem_id="talon-upload")
    view = DecodeView(
        summary,
        text,
        slider,
        caption,
        tree,
        gates,
        mask,
        timeline,
        per_step,
        by_depth,
        sources,
        speed,
        download,
        node_pick,
        inspector,
        cost,
        gr.State(Session()),
    )
    return view, walk, {"prev": prev, "next": nxt, "latest": latest, "upload": upload, "full_tree": full_tree}


def _model_event(settings: Settings) -> dict[str, Any]:
    """Listener options of every event that runs a model: one shared concurrency group."""
    return dict(
        concurrency_id=MODEL_CONCURRENCY_ID, concurrency_limit=queue_limits(settings)[0], show_progress="minimal"
    )


def _wire_decode(
    view: DecodeView, panel: ControlPanel, buttons: dict[str, Any], compare: CompareView, settings: Settings
) -> None:
    model_events = _model_event(settings)
    kwargs = {
        **panel.components,
        "compare_ar": panel.compare_ar,
        "step_through": panel.step_through,
        "session": view.state,
    }
    run_inputs: dict[str, Any] = dict(inputs=[panel.prompt], inputs_kwargs=kwargs, outputs=view.outputs())
    generate = make_generate(view, settings)
    full_tree = buttons["full_tree"]
    offer = dict(fn=make_offer_full_tree(full_tree), inputs=[view.state], outputs=[full_tree],
                 concurrency_limit=None, show_progress="hidden", api_visibility="private")
    panel.run.click(generate, **run_inputs, api_name="generate", **model_events).then(**offer)
    panel.prompt.submit(generate, **run_inputs, api_visibility="private", **model_events).then(**offer)
    # the offer's one click: the same run with cost-aware planning off, everything else kept
    full_tree.click(lambda: (False, gr.update(visible=False)), None, [panel.components["cost_aware"], full_tree],
                    api_visibility="private", concurrency_limit=None, show_progress="hidden").then(
        generate, **run_inputs, api_visibility="private", **model_events).then(**offer)
    quick = dict(outputs=view.outputs(), concurrency_limit=None, show_progress="hidden", api_visibility="private")
    panel.stop.click(stop, [view.state, compare.state], None, concurrency_limit=None, api_visibility="private")
    view.slider.input(make_show_step(view), [view.slider, view.state], trigger_mode="always_last", **quick)
    view.node_pick.input(make_inspect(view), [view.node_pick, view.state], [view.inspector],
                         concurrency_limit=None, show_progress="hidden", api_visibility="private")
    buttons["prev"].click(make_nudge(view, -1), [view.state], **quick)
    buttons["next"].click(make_nudge(view, +1), [view.state], **quick)
    buttons["latest"].click(make_nudge(view, 0), [view.state], **quick)
    buttons["upload"].upload(
        make_replay(view), [buttons["upload"], view.state], view.outputs(), api_name="replay", concurrency_limit=None
    ).then(**offer)


def _run_on_click(button: gr.Button, fn: Callable[..., Any], panel: ControlPanel, extra: dict[str, Any],
                  outputs: list[Any], api_name: str, settings: Settings) -> None:
    """Wire a tab's run button: the prompt and every control in, the tab's outputs out, queued
    like a model run."""
    button.click(fn, inputs=[panel.prompt], inputs_kwargs={**panel.components, **extra}, outputs=outputs,
                 api_name=api_name, **_model_event(settings))


def _compare_tab(panel: ControlPanel, settings: Settings) -> CompareView:
    gr.Markdown(EXPLAIN["compare"], elem_classes=["talon-explain"])
    with gr.Row():
        tree_b = gr.Radio(label="B: tree", choices=list(TREE_MODES), value="static")
        drafter_b = gr.Radio(label="B: drafter", choices=list(UI_DRAFTERS), value=Controls().drafter)
        mu_b = gr.Slider(0.0, 1.0, value=Controls().mu, step=0.01, label="B: gate μ")
    go_button = gr.Button("Run A and B", variant="primary", elem_id="talon-compare-run")
    summary = gr.HTML(compare_summary_html(CompareSession(), "Press “Run A and B”."))
    chart = gr.Plot(show_label=False)
    with gr.Row():
        with gr.Column(min_width=320):
            text_a = gr.HTML(F.text_html([]), max_height=260)
            tree_a = gr.Plot(show_label=False)
        with gr.Column(min_width=320):
            text_b = gr.HTML(F.text_html([]), max_height=260)
            tree_b_plot = gr.Plot(show_label=False)
    view = CompareView(summary, text_a, text_b, tree_a, tree_b_plot, chart, gr.State(CompareSession()))
    extra = {"tree_mode_b": tree_b, "drafter_b": drafter_b, "mu_b": mu_b, "cmp": view.state}
    _run_on_click(go_button, make_compare(view, settings), panel, extra, view.outputs(), "compare", settings)
    return view


def _sweep_tab(panel: ControlPanel, settings: Settings) -> AtlasView:
    gr.Markdown(EXPLAIN["sweep"], elem_classes=["talon-explain"])
    atlas = atlas_panel()
    record_extra = {"atlas_state": atlas.state, "min_match": atlas.knobs["retrieval_min_match"]}
    _run_on_click(atlas.record, make_record(atlas, settings), panel, record_extra, atlas.all_outputs(),
                  "record_atlas", settings)
    wire_atlas(atlas, panel.components, panel.prompt)
    with gr.Accordion("Measure with real runs, or load benchmark results (python -m talon.bench --sweep)",
                      open=False, elem_id="talon-real-sweep"):
        gr.Markdown(EXPLAIN["real_sweep"], elem_classes=["talon-explain"])
        with gr.Row():
            mus = gr.Textbox(label="μ values", value="0.02, 0.1, 0.3")
            budgets = gr.Textbox(label="Budgets N", value="8, 16, 32")
            tokens = gr.Slider(4, 128, value=24, step=1, label="New tokens per run")
        with gr.Row():
            go_button = gr.Button("Sweep the current prompt with real runs", variant="secondary")
            results = gr.File(label="…or load results.json", file_types=[".json"])
        with gr.Row():
            suite = gr.Dropdown(label="Suite", choices=[], value=None, allow_custom_value=True)
            method = gr.Dropdown(label="Method", choices=[], value=None, allow_custom_value=True)
        progress = gr.HTML("")
        with gr.Row():
            mat = gr.Plot(show_label=False)
            speed = gr.Plot(show_label=False)
    view = SweepView(progress, mat, speed, suite, method, gr.State([]))
    extra = {"mus": mus, "budgets": budgets, "sweep_tokens": tokens, "rows_state": view.state}
    _run_on_click(go_button, make_sweep(view, settings), panel, extra, view.outputs(), "sweep", settings)
    results.upload(make_load_sweep(view), [results], view.outputs(), api_name="load_sweep")
    filter_sweep = make_filter_sweep(view)
    for box in (suite, method):
        box.input(filter_sweep, [suite, method, view.state], view.outputs(), api_visibility="private")
    return atlas


def _serving_tab(panel: ControlPanel, settings: Settings) -> None:
    gr.Markdown(EXPLAIN["serve"], elem_classes=["talon-explain"])
    go_button = gr.Button("Translate the current controls", variant="primary", elem_id="talon-serve-run")
    flags = gr.Markdown("Press the button: the controls on the left become server flags.", elem_id="talon-serve")
    as_json = gr.JSON(label="The same, as JSON (what the /serving_config API returns)", visible=True)
    go_button.click(make_serving_config(settings), inputs_kwargs=dict(panel.components), outputs=[flags, as_json],
                    api_name="serving_config", concurrency_limit=None, show_progress="hidden")


def build_ui(settings: Settings) -> gr.Blocks:
    """The whole app. Pass css/head/theme to ``launch()`` (Gradio 6)."""
    examples = load_examples()
    with gr.Blocks(title="Talon: tree speculative decoding, step by step", delete_cache=(3600, 3600)) as demo:
        gr.HTML(HEADER)
        for notice in server_notices():
            gr.HTML(f'<div class="talon-notice">{F.esc(notice)}</div>')
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=300, elem_id="talon-controls"):
                panel = _controls(settings, examples)
            with gr.Column(scale=3, min_width=480), gr.Tabs():
                with gr.Tab("Decode", id="decode"):
                    view, walk, buttons = decode_tab()
                with gr.Tab("Compare", id="compare"):
                    compare = _compare_tab(panel, settings)
                with gr.Tab("Threshold explorer", id="sweep"):
                    _sweep_tab(panel, settings)
                with gr.Tab("Serve it", id="serve"):
                    _serving_tab(panel, settings)
        _wire_decode(view, panel, buttons, compare, settings)
        wire_walk(walk, view.state)
        demo.load(make_show_recording(view), [view.state], view.outputs(), api_visibility="private",
                  concurrency_limit=None, show_progress="hidden")
        # the prompt box and the controls as the recording was made, so Run repeats it
        demo.load(recording_controls(panel.prompt, panel.components), None, [panel.prompt, *panel.components.values()],
                  api_visibility="private", concurrency_limit=None, show_progress="hidden")
    return demo
