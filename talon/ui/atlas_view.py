"""The Threshold explorer's draft atlas: record one for the current prompt (the models run once:
a greedy run and batched draft forwards, ``talon.atlas.record``) or upload one, then every greedy
configuration the knobs describe is replayed from it (``talon.atlas.replay``) in milliseconds,
with no model: the knobs' score, heatmaps over mu x N and K x k around them, a Pareto chart, the
best configuration under the atlas's cost model, a replayed step's tree, and Apply, which sets
the controls on the left. The atlas lives in the browser session's ``gr.State``."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from talon import figures as F
from talon.atlas.data import Atlas, parse_atlas
from talon.atlas.record import record_atlas
from talon.atlas.replay import ReplayResult, replay
from talon.atlas.sweep import SweepRow, best_row, pareto, replay_one, result_of
from talon.presets import ModelPreset
from talon.run_config import TREE_MODES, ConfigError, RetrievalConfig, RunConfig, TreeConfig
from talon.settings import Settings
from talon.trace import TraceFileError, read_json_upload
from talon.ui.backend import (
    GPU_MAX_S,
    GPU_PER_TOKEN_S,
    DeviceRun,
    Job,
    gpu_seconds,
    load_engine,
    on_gpu,
    out_of_memory_as_error,
)
from talon.ui.controls import UI_DRAFTERS, Controls, user_error
from talon.ui.files import TRACE_MAX_AGE_S, trace_dir, upload_path

# the grids drawn around the knobs: the ladder values nearest to the knob's, and the knob's own
MU_LADDER = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0)
BUDGET_LADDER = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
ROOT_K_LADDER = tuple(range(1, 17))
TOP_K_LADDER = tuple(range(1, 9))
GRID_SIDE = 5  # mu x N: 5 x 5 replays
K_GRID_SIDE = 4  # K x k: 4 x 4
MAX_MEMO = 20_000  # replayed configurations kept per session


# ---------------------------------------------------------------------------------------------
# The knobs: one greedy configuration to replay
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Knobs:
    """What the explorer varies, named as ``talon generate``'s flags (``talon.atlas.sweep``)."""

    drafter: str = RunConfig.drafter
    tree: str = TreeConfig.mode
    budget: int = TreeConfig.budget
    root_k: int = TreeConfig.root_k
    top_k: int = TreeConfig.top_k
    mu: float = TreeConfig.mu
    max_depth: int = TreeConfig.max_depth
    min_conf: float = TreeConfig.min_conf
    retrieval_min_match: int = RetrievalConfig.min_match
    graft_threshold: int = RetrievalConfig.graft_threshold
    cost_aware: bool = TreeConfig.cost_aware

    @classmethod
    def from_ui(cls, **values: Any) -> Knobs:
        """Knobs from the UI or API (sliders send floats); ConfigError for a bad value."""
        ints = {"budget", "root_k", "top_k", "max_depth", "retrieval_min_match", "graft_threshold"}
        out: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            value = values.get(f.name, f.default)
            if f.name in ints:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
                    raise ConfigError(f"{f.name} must be an integer, got {value!r}")
                value = int(value)
            elif f.name in ("mu", "min_conf"):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise ConfigError(f"{f.name} must be a number, got {value!r}")
                value = round(float(value), 6)
            elif f.name == "cost_aware":
                value = value is True
            out[f.name] = value
        if out["drafter"] not in UI_DRAFTERS:
            raise ConfigError(f"drafter must be one of {UI_DRAFTERS}, got {out['drafter']!r}")
        if out["tree"] not in TREE_MODES:
            raise ConfigError(f"tree mode must be one of {TREE_MODES}, got {out['tree']!r}")
        return cls(**out)

    @classmethod
    def from_controls(cls, controls: Controls, min_match: int = RetrievalConfig.min_match) -> Knobs:
        """The knobs of the left panel's controls (which have no min_match: it is kept)."""
        return cls.from_ui(drafter=controls.drafter, tree=controls.tree_mode, budget=controls.budget,
                           root_k=controls.root_k, top_k=controls.top_k, mu=controls.mu,
                           max_depth=controls.max_depth, min_conf=controls.min_conf,
                           retrieval_min_match=min_match, graft_threshold=controls.retrieval_threshold,
                           cost_aware=controls.cost_aware)

    def values(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def config(self, atlas: Atlas) -> RunConfig:
        """The greedy RunConfig replayed over ``atlas`` (its draft vocabulary, to its end)."""
        tree = TreeConfig(mode=self.tree, budget=self.budget, root_k=self.root_k, top_k=self.top_k,  # type: ignore[arg-type]
                          mu=self.mu, max_depth=self.max_depth, min_conf=self.min_conf, cost_aware=self.cost_aware)
        retrieval = RetrievalConfig(min_match=self.retrieval_min_match, graft_threshold=self.graft_threshold)
        return RunConfig(drafter=self.drafter, tree=tree, retrieval=retrieval,  # type: ignore[arg-type]
                         max_new_tokens=max(1, len(atlas.output)),
                         draft_vocab=int(atlas.models.get("draft_vocab", RunConfig.draft_vocab)))

    def controls(self) -> dict[str, Any]:
        """The left panel's controls (``Controls`` fields) that run this configuration."""
        return {"drafter": self.drafter, "tree_mode": self.tree, "budget": self.budget, "root_k": self.root_k,
                "top_k": self.top_k, "mu": self.mu, "max_depth": self.max_depth, "min_conf": self.min_conf,
                "retrieval_threshold": self.graft_threshold, "cost_aware": self.cost_aware}


def around(ladder: Sequence[Any], value: Any, count: int) -> list[Any]:
    """``count`` values of ``ladder`` (plus ``value``) centred on ``value``."""
    values = sorted({*ladder, value})
    i = values.index(value)
    start = max(0, min(i - count // 2, len(values) - count))
    return values[start : start + count]


def mu_budget_grid(knobs: Knobs) -> list[Knobs]:
    return [dataclasses.replace(knobs, mu=mu, budget=n)
            for mu in around(MU_LADDER, knobs.mu, GRID_SIDE) for n in around(BUDGET_LADDER, knobs.budget, GRID_SIDE)]


def root_top_grid(knobs: Knobs) -> list[Knobs]:
    return [dataclasses.replace(knobs, root_k=rk, top_k=tk)
            for rk in around(ROOT_K_LADDER, knobs.root_k, K_GRID_SIDE)
            for tk in around(TOP_K_LADDER, knobs.top_k, K_GRID_SIDE)]


# ---------------------------------------------------------------------------------------------
# A session's atlas and its replays
# ---------------------------------------------------------------------------------------------


@dataclass
class AtlasSession:
    """One browser session's atlas, its download, and every configuration replayed on it."""

    atlas: Atlas | None = None
    download: str | None = None
    rows: dict[Knobs, SweepRow] = field(default_factory=dict)
    result: ReplayResult | None = None  # the knobs' replay: the steps the step view shows

    def load(self, atlas: Atlas, download: str | None) -> None:
        self.atlas, self.download, self.rows, self.result = atlas, download, {}, None

    def score(self, knobs: Knobs, result: ReplayResult | None = None) -> SweepRow:
        """The replay of ``knobs`` (``result`` when already replayed), remembered (a replay is
        deterministic)."""
        assert self.atlas is not None
        row = self.rows.get(knobs)
        if row is None:
            if len(self.rows) >= MAX_MEMO:
                self.rows.clear()
            cfg = knobs.config(self.atlas)
            done = result_of(result) if result is not None else replay_one(self.atlas, 0, cfg)
            row = self.rows[knobs] = SweepRow(knobs.values(), cfg, [done])
        return row


@dataclass
class Exploration:
    """The knobs' replay and the configurations around them."""

    result: ReplayResult
    current: SweepRow
    mu_budget: list[SweepRow]
    root_top: list[SweepRow]
    best: SweepRow  # most predicted tokens/s of everything here (talon.atlas.sweep.best_row)
    front: list[SweepRow]  # the Pareto front of everything here

    @property
    def rows(self) -> list[SweepRow]:
        return unique_rows([self.current, *self.mu_budget, *self.root_top])


def unique_rows(rows: Sequence[SweepRow]) -> list[SweepRow]:
    seen: dict[tuple[tuple[str, Any], ...], SweepRow] = {}
    for row in rows:
        seen.setdefault(tuple(row.values.items()), row)
    return list(seen.values())


def explore(session: AtlasSession, knobs: Knobs) -> Exploration:
    """Replay the knobs (with its steps) and the grids around them; ConfigError for bad knobs."""
    assert session.atlas is not None
    result = replay(session.atlas, knobs.config(session.atlas))
    session.result = result
    current = session.score(knobs, result)
    mu_budget = [session.score(k) for k in mu_budget_grid(knobs)]
    root_top = [session.score(k) for k in root_top_grid(knobs)]
    rows = unique_rows([current, *mu_budget, *root_top])
    return Exploration(result, current, mu_budget, root_top, best_row(rows), pareto(rows))


# ---------------------------------------------------------------------------------------------
# Recording on the device, and atlas files
# ---------------------------------------------------------------------------------------------


def record_seconds(settings: Settings, preset: ModelPreset, prompt: str, cfg: RunConfig) -> int:
    """GPU seconds to reserve for a recording: a run (and a load, where another pair is held) plus
    the draft's batched forwards."""
    run = gpu_seconds(settings, [Job(preset, prompt, cfg)])
    return min(GPU_MAX_S, math.ceil(run + GPU_PER_TOKEN_S * cfg.max_new_tokens))


@on_gpu(duration=record_seconds)
def record_on_device(
    settings: Settings, preset: ModelPreset, prompt: str, cfg: RunConfig
) -> Iterator[tuple[float, str] | Atlas]:
    """Record the atlas of ``prompt``: yields (fraction done, what is happening), then the Atlas.
    Takes and yields only picklable values (on ZeroGPU it runs in a GPU worker)."""
    events: queue.Queue[tuple[float, str] | Atlas | BaseException] = queue.Queue()

    def work() -> None:
        try:
            with out_of_memory_as_error(cfg):
                engine = load_engine(settings, preset)
                events.put(record_atlas(engine, prompt, cfg, progress=lambda f, what: events.put((f, what))))
        except BaseException as error:  # handed to the caller's thread, raised there
            events.put(error)

    threading.Thread(target=work, daemon=True, name="talon-atlas-record").start()
    while True:
        item = events.get()
        if isinstance(item, BaseException):
            raise item
        yield item
        if isinstance(item, Atlas):
            return


def write_atlas(atlas: Atlas) -> str:
    """Write the atlas as a talon-atlas/1 JSON file for download; old files are swept away."""
    folder, now = trace_dir(), time.time()
    for old in folder.glob("talon-atlas-*.json"):
        with contextlib.suppress(OSError):  # another session may be sweeping too
            if now - old.stat().st_mtime > TRACE_MAX_AGE_S:
                old.unlink()
    path = folder / f"talon-atlas-{uuid.uuid4().hex[:12]}.json"
    path.write_text(json.dumps(atlas.to_dict(), separators=(",", ":")), encoding="utf-8")
    return str(path)


def read_atlas(upload: Any) -> Atlas:
    """The atlas in an uploaded file; a gr.Error that says what is wrong otherwise."""
    if not upload:
        raise gr.Error("no file: upload an atlas JSON downloaded from this tab or written by `talon atlas record`")
    try:
        return parse_atlas(read_json_upload(upload_path(upload)))
    except (TraceFileError, OSError) as error:
        raise user_error(f"cannot load this atlas: {error}") from error


# ---------------------------------------------------------------------------------------------
# Words: the greedy-only note, progress, what the atlas holds
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
    return (f'<div class="talon-atlas-held">Atlas of “{F.esc(prompt)}”: {len(atlas.output)} tokens of the target\'s '
            f"greedy text, {len(atlas.children):,} draft nodes (up to N {atlas.spec.n_nodes}, K {atlas.spec.root_k}, "
            f"k {atlas.spec.top_k}, depth {atlas.spec.max_depth}){took}; "
            f"{F.esc(str(atlas.models.get('target', '')))} with {F.esc(str(atlas.models.get('draft', '')))}.</div>")


# ---------------------------------------------------------------------------------------------
# The view: components and their updates
# ---------------------------------------------------------------------------------------------


@dataclass
class AtlasView:
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
    state: gr.State

    def score_outputs(self) -> list[Any]:
        return [self.score, self.mu_mat, self.mu_speed, self.k_mat, self.k_speed, self.pareto,
                self.step, self.caption, self.tree, self.gates, self.state]

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
                    self.state: session}
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
            self.state: session,
        }

    def knob_updates(self, knobs: Knobs) -> dict[Any, Any]:
        return {self.knobs[name]: value for name, value in knobs.values().items()}


# ---------------------------------------------------------------------------------------------
# Handlers
# ---------------------------------------------------------------------------------------------


def make_record(view: AtlasView, settings: Settings) -> Callable[..., Iterator[dict[Any, Any]]]:
    def record(prompt: str, atlas_state: AtlasSession, min_match: float = RetrievalConfig.min_match,
               **controls: Any) -> Iterator[dict[Any, Any]]:
        """Record the draft atlas of the prompt with the controls on the left (the models run
        once), then score the controls' configuration from it."""
        values = Controls(**controls)
        run = DeviceRun(settings, prompt, values, threading.Event())  # validates (elsewhere than ZeroGPU: loads)
        yield {view.status: progress_html(0.0, "loading the models…")}
        atlas = None
        for item in record_on_device(settings, run.preset, prompt, run.cfg):
            if isinstance(item, Atlas):
                atlas = item
            else:
                yield {view.status: progress_html(*item)}
        assert atlas is not None
        atlas_state.load(atlas, write_atlas(atlas))
        knobs = Knobs.from_ui(**{**Knobs.from_controls(values).values(), "retrieval_min_match": min_match})
        yield {view.status: atlas_words(atlas), view.download: atlas_state.download, **view.knob_updates(knobs),
               **view.score_updates(atlas_state, knobs, 0, "the knobs are set as on the left: move them")}

    return record


def make_upload(view: AtlasView) -> Callable[..., dict[Any, Any]]:
    def upload_atlas(upload: Any, atlas_state: AtlasSession, **knob_values: Any) -> dict[Any, Any]:
        """Load an atlas file (``talon-atlas/1``) and score the knobs from it, no model needed."""
        atlas = read_atlas(upload)
        atlas_state.load(atlas, None)
        return {view.status: atlas_words(atlas), **view.score_updates(atlas_state, knobs_of(knob_values), 0)}

    return upload_atlas


def knobs_of(values: dict[str, Any]) -> Knobs:
    try:
        return Knobs.from_ui(**values)
    except ConfigError as error:
        raise user_error(str(error)) from error


def make_rescore(view: AtlasView) -> Callable[..., dict[Any, Any]]:
    def rescore(atlas_state: AtlasSession, step: Any = 0, **knob_values: Any) -> dict[Any, Any]:
        """Replay the knobs' configuration from the session's atlas (no model) and redraw."""
        return view.score_updates(atlas_state, knobs_of(knob_values), step)

    return rescore


def make_show_step(view: AtlasView) -> Callable[[Any, AtlasSession], dict[Any, Any]]:
    def show_step(index: Any, atlas_state: AtlasSession) -> dict[Any, Any]:
        return view.step_updates(atlas_state, index)

    return show_step


def best_knobs(atlas_state: AtlasSession, knobs: Knobs) -> Knobs:
    """The best configuration around ``knobs`` (most predicted tokens/s)."""
    if atlas_state.atlas is None:
        raise gr.Error("no atlas yet: record one for the prompt, or upload one")
    try:
        return Knobs.from_ui(**explore(atlas_state, knobs).best.values)
    except ConfigError as error:
        raise user_error(str(error)) from error


def make_to_best(view: AtlasView) -> Callable[..., dict[Any, Any]]:
    def to_best(atlas_state: AtlasSession, **knob_values: Any) -> dict[Any, Any]:
        """Move the knobs to the best configuration found around them (press again to climb on)."""
        best = best_knobs(atlas_state, knobs_of(knob_values))
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


def apply_words(knobs: Knobs, what: str) -> str:
    words = f"Applied {what} to the controls on the left: {F.config_words(knobs.values())}."
    if knobs.retrieval_min_match != RetrievalConfig.min_match:
        words += (f" Min match {knobs.retrieval_min_match} has no control there (runs use "
                  f"{RetrievalConfig.min_match}); on the command line: --retrieval-min-match "
                  f"{knobs.retrieval_min_match}.")
    return words + (" The prompt box, the length and greedy sampling are the atlas's: press Run to decode it "
                    "for real.")


def make_apply(view: AtlasView, components: dict[str, Any], best: bool, prompt: Any = None) -> Callable[..., dict[Any, Any]]:
    def apply(atlas_state: AtlasSession, **knob_values: Any) -> dict[Any, Any]:
        """Set the controls on the left to the knobs' configuration (or to the best one found)."""
        knobs = knobs_of(knob_values)
        if best:
            knobs = best_knobs(atlas_state, knobs)
        words = apply_words(knobs, "the best configuration" if best else "the knobs")
        applied = f'<div class="talon-applied">{F.esc(words)}</div>'
        updates = apply_controls(knobs, components, atlas_state.atlas, prompt)
        return {**updates, view.status: applied + atlas_words(atlas_state.atlas)}

    return apply


# ---------------------------------------------------------------------------------------------
# Layout and wiring
# ---------------------------------------------------------------------------------------------


def _knob_components() -> dict[str, Any]:
    k = Knobs()
    c: dict[str, Any] = {}
    with gr.Row():
        c["drafter"] = gr.Radio(label="Drafter", choices=list(UI_DRAFTERS), value=k.drafter, elem_id="talon-atlas-drafter")
        c["tree"] = gr.Radio(label="Tree", choices=list(TREE_MODES), value=k.tree, elem_id="talon-atlas-tree")
        c["cost_aware"] = gr.Checkbox(label="Cost-aware planning", value=k.cost_aware, elem_id="talon-atlas-cost-aware")
    with gr.Row():
        c["budget"] = gr.Slider(1, 128, value=k.budget, step=1, label="Budget N", elem_id="talon-atlas-budget")
        c["root_k"] = gr.Slider(1, 16, value=k.root_k, step=1, label="Root K", elem_id="talon-atlas-root-k")
        c["top_k"] = gr.Slider(1, 8, value=k.top_k, step=1, label="k per node", elem_id="talon-atlas-top-k")
        c["mu"] = gr.Slider(0.0, 1.0, value=k.mu, step=0.01, label="Gate μ", elem_id="talon-atlas-mu")
    with gr.Row():
        c["max_depth"] = gr.Slider(1, 32, value=k.max_depth, step=1, label="Max depth", elem_id="talon-atlas-depth")
        c["min_conf"] = gr.Slider(0.0, 1.0, value=k.min_conf, step=0.01, label="Min confidence",
                                  elem_id="talon-atlas-min-conf")
        c["retrieval_min_match"] = gr.Slider(1, 16, value=k.retrieval_min_match, step=1,
                                             label="Retrieval min match", elem_id="talon-atlas-min-match")
        c["graft_threshold"] = gr.Slider(1, 16, value=k.graft_threshold, step=1, label="Graft threshold",
                                         elem_id="talon-atlas-graft")
    return c


def atlas_panel() -> AtlasView:
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
    knobs = _knob_components()
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
    return AtlasView(record, upload, download, note, status, knobs, score, to_best, apply_knobs, apply_best,
                     mu_mat, mu_speed, k_mat, k_speed, pareto_plot, step, caption, tree, gates,
                     gr.State(AtlasSession()))


def wire_atlas(view: AtlasView, components: dict[str, Any], prompt: Any = None) -> None:
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
