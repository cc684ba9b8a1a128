"""The Threshold explorer tab: the atlas explorer (record or upload a prompt's draft atlas, then
every knob replays the configuration it describes in milliseconds, with no model: the score,
heatmaps over mu x N and K x k, a Pareto chart, the best configuration under the atlas's cost
model, a replayed step's tree, and Apply, which sets the controls on the left), then the
measured part below it (``measure_view``). The model is ``talon.atlas.explorer``, the files
``explorer_io``; the atlas lives in the browser session's ``gr.State``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from talon import figures as F
from talon.atlas.data import Atlas
from talon.atlas.explorer import AtlasSession, Knobs, best_knobs, explore
from talon.run_config import ConfigError, RetrievalConfig
from talon.settings import Settings
from talon.ui.actions import DeviceRun
from talon.ui.controls import Controls, user_error
from talon.ui.explorer_io import read_atlas, record_on_device, write_atlas
from talon.ui.explorer_words import apply_words, atlas_words, progress_html


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


def make_record(view: ExplorerView, settings: Settings) -> Callable[..., Iterator[dict[Any, Any]]]:
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


def make_upload(view: ExplorerView) -> Callable[..., dict[Any, Any]]:
    def upload_atlas(upload: Any, atlas_state: AtlasSession, **knob_values: Any) -> dict[Any, Any]:
        """Load an atlas file (``talon-atlas/1``) and score the knobs from it, no model needed."""
        atlas = read_atlas(upload)
        atlas_state.load(atlas, None)
        return {view.status: atlas_words(atlas), **view.score_updates(atlas_state, knobs_of(knob_values), 0)}

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
    def rescore(atlas_state: AtlasSession, step: Any = 0, **knob_values: Any) -> dict[Any, Any]:
        """Replay the knobs' configuration from the session's atlas (no model) and redraw."""
        return view.score_updates(atlas_state, knobs_of(knob_values), step)

    return rescore


def make_show_step(view: ExplorerView) -> Callable[[Any, AtlasSession], dict[Any, Any]]:
    def show_step(index: Any, atlas_state: AtlasSession) -> dict[Any, Any]:
        return view.step_updates(atlas_state, index)

    return show_step


def make_to_best(view: ExplorerView) -> Callable[..., dict[Any, Any]]:
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


def make_apply(view: ExplorerView, components: dict[str, Any], best: bool, prompt: Any = None) -> Callable[..., dict[Any, Any]]:
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
# Layout and wiring
# ---------------------------------------------------------------------------------------------
