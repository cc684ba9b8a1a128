"""The Threshold explorer tab: the atlas explorer (record or upload a prompt's draft atlas, then
every knob replays the configuration it describes in milliseconds, with no model: the score,
heatmaps over mu x N and K x k, a Pareto chart, the best configuration under the atlas's cost
model, a replayed step's tree, and Apply, which sets the controls on the left), then the measured
part below it (``measure_panel``). Its layout and wiring (its knobs are the knob table's, with
short labels), its view and handlers, and its words (HTML: the greedy-only note, the progress bar,
what the loaded atlas holds, what Apply did). The model is ``talon.atlas.explorer``; the atlas
lives in the browser session's ``gr.State``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from talon import figures as F
from talon.atlas.adaptive_sweep import RULES
from talon.atlas.data import Atlas
from talon.atlas.explorer import AtlasSession, Knobs, best_knobs, drafters_of, explore
from talon.knobs import ATLAS_DRAFTING_KINDS, KNOB, default
from talon.run_config import ConfigError, RetrievalConfig
from talon.server.facade import Controls, decode, record_prompt_atlas, user_error, wait_for_pair
from talon.settings import Settings
from talon.ui.files import read_atlas, write_atlas
from talon.ui.measure_panel import build_measure_panel
from talon.ui.panel import ControlPanel, control, run_on_click, waiting_plot
from talon.ui.session import bounded, sessionless
from talon.ui.words import EXPLAIN

DEFAULT_RULE = "hf-heuristic"
ADAPTIVE_WORDS = (
    "#### Adaptive draft length: each engine's own rule on this atlas\n"
    "Engines now choose how many tokens to draft from the acceptance history: transformers' heuristic (+2 when "
    "a whole draft is accepted, −1 otherwise) and its moving confidence threshold, SGLang's adaptive steps, "
    "vLLM's K by batch size. The chart shows what one rule drafted at every step and what the target would "
    "have accepted there (the oracle, known from the atlas); the table ranks every rule at its defaults and at "
    "its best setting on this atlas, beside TALON's confidence gate at the knobs above.")

# ---------------------------------------------------------------------------------------------
# Layout and wiring
# ---------------------------------------------------------------------------------------------

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
                extra = {"choices": list(ATLAS_DRAFTING_KINDS)} if name == "drafter" else {}
                c[name] = control(KNOB[name], label=label, elem_id=f"talon-atlas-{elem}", **extra)
    return c


FIRST = "record or load an atlas first."


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
    with gr.Row():  # until an atlas comes, each plot says what will draw it
        mu_mat = waiting_plot(f"MAT by μ and N: {FIRST}", elem_id="talon-atlas-mu-mat")
        mu_speed = waiting_plot(f"Tokens/s by μ and N: {FIRST}", elem_id="talon-atlas-mu-speed")
    with gr.Row():
        k_mat = waiting_plot(f"MAT by root K and k: {FIRST}", elem_id="talon-atlas-k-mat")
        k_speed = waiting_plot(f"Tokens/s by root K and k: {FIRST}", elem_id="talon-atlas-k-speed")
    pareto_plot = waiting_plot(f"MAT against tokens/s, every configuration: {FIRST}", elem_id="talon-atlas-pareto")
    gr.Markdown(ADAPTIVE_WORDS, elem_classes=["talon-explain"])
    rule = gr.Radio(list(RULES[1:]), value=DEFAULT_RULE, label="Adaptive rule (drawn at its best setting)",
                    elem_id="talon-atlas-rule")
    lengths = waiting_plot(f"A rule's draft lengths against the oracle: {FIRST}", elem_id="talon-atlas-lengths")
    rules_table = gr.HTML(F.rules_table_html([]), elem_id="talon-atlas-rules")
    gr.Markdown("#### A replayed step of the knobs' configuration")
    step = gr.Slider(0, 1, value=0, step=1, label="Replayed step", elem_id="talon-atlas-step")
    caption = gr.HTML(F.step_caption_html([], 0), elem_id="talon-atlas-caption")
    with gr.Row():
        tree = waiting_plot("Replayed steps appear here.", scale=3, elem_id="talon-atlas-tree")
        gates = waiting_plot("Their confidence gates appear here.", scale=2, elem_id="talon-atlas-gates")
    return ExplorerView(record=record, upload=upload, download=download, note=note, status=status, knobs=knobs,
                        score=score, to_best=to_best, apply_knobs=apply_knobs, apply_best=apply_best, mu_mat=mu_mat,
                        mu_speed=mu_speed, k_mat=k_mat, k_speed=k_speed, pareto=pareto_plot, step=step,
                        caption=caption, tree=tree, gates=gates, rule=rule, lengths=lengths, rules_table=rules_table,
                        state=gr.State(AtlasSession()))


def wire_explorer(view: ExplorerView, components: dict[str, Any], prompt: Any = None) -> None:
    """Every handler but Record (a model run, wired with the other tabs' run buttons); ``components``
    are the left panel's controls, ``prompt`` its prompt box (Apply sets it to the atlas's)."""
    quick = dict(concurrency_limit=None, show_progress="hidden")
    knob_inputs = {**view.knobs, "atlas_state": view.state}
    rescore = make_rescore(view)
    for name, component in view.knobs.items():
        component.input(rescore, inputs_kwargs={**knob_inputs, "step": view.step}, outputs=view.score_outputs(),
                        trigger_mode="always_last", api_visibility="private", **quick)  # the API: /load_atlas
    view.rule.input(make_rule_choice(view), inputs_kwargs={**knob_inputs, "rule": view.rule},
                    outputs=[view.lengths, view.rules_table, view.state], api_visibility="private", **quick)
    view.step.input(make_show_replayed_step(view), [view.step, view.state],
                    [view.step, view.caption, view.tree, view.gates],
                    trigger_mode="always_last", api_visibility="private", **quick)
    upload_outputs = [view.status, *view.score_outputs(), view.knobs["drafter"]]
    view.upload.upload(make_upload(view), inputs=[view.upload], inputs_kwargs=knob_inputs, outputs=upload_outputs,
                       api_visibility="private", **quick)
    gr.Button(visible=False).click(sessionless(make_upload(view), AtlasSession), inputs=[view.upload],  # the API's
                                   inputs_kwargs=view.knobs, api_name="load_atlas", **quick,
                                   outputs=[o for o in upload_outputs if o is not view.state])
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


@dataclass
class ExplorerView:
    """The atlas explorer's components; the handlers below turn the model's answers into updates."""

    record: gr.Button
    upload: gr.File
    download: gr.File
    note: gr.HTML  # the greedy-only note
    status: gr.HTML
    knobs: dict[str, Any]  # Knobs field -> component
    score: gr.HTML
    to_best: gr.Button
    apply_knobs: gr.Button
    apply_best: gr.Button
    mu_mat: gr.Plot
    mu_speed: gr.Plot
    k_mat: gr.Plot
    k_speed: gr.Plot
    pareto: gr.Plot
    step: gr.Slider
    caption: gr.HTML
    tree: gr.Plot
    gates: gr.Plot
    rule: gr.Radio
    lengths: gr.Plot
    rules_table: gr.HTML
    state: gr.State

    def score_outputs(self) -> list[Any]:
        return [self.score, self.mu_mat, self.mu_speed, self.k_mat, self.k_speed, self.pareto,
                self.step, self.caption, self.tree, self.gates, self.lengths, self.rules_table, self.state]

    def all_outputs(self) -> list[Any]:
        return [self.status, self.download, *self.knobs.values(), *self.score_outputs()]

    def step_updates(self, session: AtlasSession, index: Any) -> dict[Any, Any]:
        """The replayed step ``index`` of the knobs' run: its tree, gates and caption."""
        steps = session.result.steps if session.result else []
        if not steps:
            return {self.step: gr.update(maximum=1, value=0), self.caption: F.step_caption_html([], 0),
                    self.tree: F.empty_figure("Replayed steps appear here."), self.gates: F.empty_figure("")}
        try:
            i = max(0, min(int(index), len(steps) - 1))
        except (TypeError, ValueError):
            i = 0
        vocab = F.token_vocab(steps[max(0, i - 50) : i + 1])
        return {self.step: gr.update(maximum=max(len(steps) - 1, 1), value=i),
                self.caption: F.step_caption_html(steps, i), self.tree: F.tree_figure(steps[i], vocab),
                self.gates: F.gate_figure(steps[i])}

    def score_updates(self, session: AtlasSession, knobs: Knobs, index: Any = 0, note: str = "") -> dict[Any, Any]:
        """Replay the knobs and redraw the score, the heatmaps, the Pareto chart and the step."""
        if session.atlas is None:
            empty = F.empty_figure("Record or load an atlas first.")
            return {self.score: F.atlas_score_html(None, note=note), self.mu_mat: empty, self.mu_speed: empty,
                    self.k_mat: empty, self.k_speed: empty, self.pareto: empty, **self.step_updates(session, 0),
                    **self.adaptive_updates(session, knobs), self.state: session}
        try:
            found = explore(session, knobs)
        except ConfigError as error:
            raise user_error(str(error)) from error
        best, current = found.best, found.current
        return {
            self.score: F.atlas_score_html(found.result, best, note, current),
            self.mu_mat: F.atlas_heatmap(found.mu_budget, "budget", "mu", "mat", best, current),
            self.mu_speed: F.atlas_heatmap(found.mu_budget, "budget", "mu", "tokens_per_s", best, current),
            self.k_mat: F.atlas_heatmap(found.root_top, "top_k", "root_k", "mat", best, current),
            self.k_speed: F.atlas_heatmap(found.root_top, "top_k", "root_k", "tokens_per_s", best, current),
            self.pareto: F.pareto_figure(found.rows, found.front, best, current),
            **self.step_updates(session, index),
            **self.adaptive_updates(session, knobs),
            self.state: session,
        }

    def adaptive_updates(self, session: AtlasSession, knobs: Knobs) -> dict[Any, Any]:
        """The session's adaptive rule on its atlas against the oracle, and every rule's best."""
        run, bests = session.adaptive(session.rule, knobs)
        label = f"{session.rule} at its best setting (in the table)"
        note = ("predicted on the atlas's cost curves; TALON at the knobs above, the chain rules on the draft alone"
                if bests else "")
        return {self.lengths: F.lengths_figure(run, label), self.rules_table: F.rules_table_html(bests, note)}

    def knob_updates(self, knobs: Knobs, atlas: Atlas | None = None) -> dict[Any, Any]:
        """The knobs shown as ``knobs``; with an ``atlas``, the drafter offers what it replays (an
        EAGLE-3 head's kinds, or a draft model's) and shows the knobs' kind or its counterpart."""
        updates: dict[Any, Any] = {self.knobs[name]: value for name, value in knobs.values().items()}
        if atlas is not None:
            updates[self.knobs["drafter"]] = gr.update(choices=list(drafters_of(atlas)),
                                                       value=knobs.for_atlas(atlas).drafter)
        return updates


# ---------------------------------------------------------------------------------------------
# Handlers
# ---------------------------------------------------------------------------------------------


def make_record(view: ExplorerView, settings: Settings) -> Callable[..., Iterator[dict[Any, Any]]]:
    def record(prompt: str, atlas_state: AtlasSession, min_match: float = RetrievalConfig.min_match,
               **controls: Any) -> Iterator[dict[Any, Any]]:
        """Record the draft atlas of the prompt with the controls on the left (the models run
        once), then score the controls' configuration from it."""
        values = Controls(**controls)
        try:
            for note in wait_for_pair(settings, values.preset, threading.Event()):
                yield {view.status: progress_html(0.0, note)}
        except ConfigError as error:
            raise user_error(str(error)) from error
        run = decode(settings, prompt, values, threading.Event())  # validates (elsewhere than ZeroGPU: loads)
        yield {view.status: progress_html(0.0, "recording: the target's greedy text first, then the draft's "
                                               "proposals around it…")}
        atlas = None
        for item in record_prompt_atlas(settings, run.preset, prompt, run.cfg):
            if isinstance(item, Atlas):
                atlas = item
            else:
                yield {view.status: progress_html(*item)}
        assert atlas is not None
        atlas_state.load(atlas, write_atlas(atlas))
        knobs = Knobs.from_ui(**{**Knobs.from_controls(values).values(), "retrieval_min_match": min_match})
        yield {view.status: atlas_words(atlas), view.download: atlas_state.download, **view.knob_updates(knobs, atlas),
               **view.score_updates(atlas_state, knobs, 0, "the knobs are set as on the left: move them")}

    return record


def make_upload(view: ExplorerView) -> Callable[..., dict[Any, Any]]:
    @bounded("loading the atlas")
    def upload_atlas(upload: Any, atlas_state: AtlasSession, **knob_values: Any) -> dict[Any, Any]:
        """Load an atlas file (``talon-atlas/1``) and score the knobs from it, no model needed."""
        atlas = read_atlas(upload)
        atlas_state.load(atlas, None)
        knobs = knobs_of(knob_values)
        return {view.status: atlas_words(atlas), **view.score_updates(atlas_state, knobs, 0),
                view.knobs["drafter"]: view.knob_updates(knobs, atlas)[view.knobs["drafter"]]}

    return upload_atlas


def knobs_of(values: dict[str, Any]) -> Knobs:
    return checked(Knobs.from_ui, **values)


def checked(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn``'s answer; its ConfigError as a message the user sees."""
    try:
        return fn(*args, **kwargs)
    except ConfigError as error:
        raise user_error(str(error)) from error


def make_rescore(view: ExplorerView) -> Callable[..., dict[Any, Any]]:
    @bounded("replaying the knobs")
    def rescore(atlas_state: AtlasSession, step: Any = 0, **knob_values: Any) -> dict[Any, Any]:
        """Replay the knobs' configuration from the session's atlas (no model) and redraw."""
        return view.score_updates(atlas_state, knobs_of(knob_values), step)

    return rescore


def make_rule_choice(view: ExplorerView) -> Callable[..., dict[Any, Any]]:
    @bounded("replaying the adaptive rules")
    def choose_rule(atlas_state: AtlasSession, rule: str = DEFAULT_RULE, **knob_values: Any) -> dict[Any, Any]:
        """Draw another adaptive rule's lengths on the atlas (no model)."""
        if rule not in RULES[1:]:
            raise user_error(f"the adaptive rule is one of {', '.join(RULES[1:])}, not {rule!r}")
        atlas_state.rule = rule
        return {**view.adaptive_updates(atlas_state, knobs_of(knob_values)), view.state: atlas_state}

    return choose_rule


def make_show_replayed_step(view: ExplorerView) -> Callable[[Any, AtlasSession], dict[Any, Any]]:
    def show_step(index: Any, atlas_state: AtlasSession) -> dict[Any, Any]:
        return view.step_updates(atlas_state, index)

    return show_step


def make_to_best(view: ExplorerView) -> Callable[..., dict[Any, Any]]:
    @bounded("searching the best knobs")
    def to_best(atlas_state: AtlasSession, **knob_values: Any) -> dict[Any, Any]:
        """Move the knobs to the best configuration found around them (press again to climb on)."""
        best = checked(best_knobs, atlas_state, knobs_of(knob_values))
        return {**view.knob_updates(best),
                **view.score_updates(atlas_state, best, 0, "the knobs moved to the best ★; press again to search "
                                                           "around it")}

    return to_best


def apply_controls(knobs: Knobs, components: dict[str, Any], atlas: Atlas | None = None,
                   prompt: Any = None) -> dict[Any, Any]:
    """Updates that set the left panel's controls to ``knobs``; with the ``atlas``, also the
    prompt box (``prompt``), the length and greedy sampling, so that Run decodes for real exactly
    what was replayed."""
    updates: dict[Any, Any] = {components[name]: value for name, value in knobs.controls().items()}
    if atlas is not None:
        updates[components["max_new_tokens"]] = len(atlas.output)
        updates[components["temperature"]] = 0.0
        if prompt is not None and atlas.prompt:
            updates[prompt] = atlas.prompt
    return updates


def make_apply(view: ExplorerView, components: dict[str, Any], best: bool,
               prompt: Any = None) -> Callable[..., dict[Any, Any]]:
    @bounded("searching the best knobs")
    def apply(atlas_state: AtlasSession, **knob_values: Any) -> dict[Any, Any]:
        """Set the controls on the left to the knobs' configuration (or to the best one found)."""
        knobs = knobs_of(knob_values)
        if best:
            knobs = checked(best_knobs, atlas_state, knobs)
        words = apply_words(knobs, "the best configuration" if best else "the knobs")
        applied = f'<div class="talon-applied">{F.esc(words)}</div>'
        updates = apply_controls(knobs, components, atlas_state.atlas, prompt)
        return {**updates, view.status: applied + atlas_words(atlas_state.atlas)}

    return apply


# ---------------------------------------------------------------------------------------------
# Words
# ---------------------------------------------------------------------------------------------


def greedy_note(temperature: Any) -> str:
    """Said while the temperature control is above 0: the explorer replays greedy decoding only."""
    if not isinstance(temperature, (int, float)) or temperature <= 0:
        return ""
    return (f'<div class="talon-greedy-note">Exact replay is greedy only: the explorer scores temperature 0. '
            f"With temperature {float(temperature):g} on the left, sampled runs accept differently (the atlas does "
            "not hold the target's probabilities), so sampling is out of its scope.</div>")


def progress_html(fraction: float, message: str) -> str:
    width = max(0.0, min(1.0, fraction)) * 100
    return (f'<div class="talon-progress"><div class="bar" style="width: {width:.0f}%"></div></div>'
            f'<div class="talon-status">{F.esc(message)}</div>')


def atlas_words(atlas: Atlas | None) -> str:
    """What the loaded atlas holds, in one line."""
    if atlas is None:
        return ('<div class="talon-status">No atlas yet. <b>Record</b> one for the prompt on the left (the models '
                "run once), or upload one; then every knob below re-scores instantly, with no model.</div>")
    record = atlas.record
    took = f", recorded in {record['run_s'] + record['atlas_s']:.1f} s" if {"run_s", "atlas_s"} <= set(record) else ""
    prompt = atlas.prompt if len(atlas.prompt) <= 80 else atlas.prompt[:79] + "…"
    slot = {"head": "the EAGLE-3 head", "mtp": "its own MTP layer"}.get(atlas.draft_kind, "the draft model")
    return (f'<div class="talon-atlas-held">Atlas of “{F.esc(prompt)}”: {len(atlas.output)} tokens of the target\'s '
            f"greedy text, {len(atlas.children):,} draft nodes (up to N {atlas.spec.n_nodes}, K {atlas.spec.root_k}, "
            f"k {atlas.spec.top_k}, depth {atlas.spec.max_depth}){took}; "
            f"{F.esc(str(atlas.models.get('target', '')))} with {slot} {F.esc(str(atlas.models.get('draft', '')))}; "
            f"it replays {', '.join(drafters_of(atlas))}.</div>")


def apply_words(knobs: Knobs, what: str) -> str:
    words = f"Applied {what} to the controls on the left: {F.config_words(knobs.values())}."
    if knobs.retrieval_min_match != default("retrieval.min_match"):
        words += (f" Min match {knobs.retrieval_min_match} has no control there (runs use "
                  f"{default('retrieval.min_match')}); on the command line: --retrieval-min-match "
                  f"{knobs.retrieval_min_match}.")
    return words + (" The prompt box, the length and greedy sampling are the atlas's: press Run to decode it "
                    "for real.")
