"""One request, validated before any forward (``validate``): the controls into a preset and a RunConfig
(``plan_run``), then every check a user can act on (``check_job``: the prompt, the context
window, the drafter, the server's prompt limit), so every error a user can fix is raised
before any output changes. ``Job`` is the result, handed on to the device call. The run controls
as the UI and the API send them (``Controls``) are validated into a RunConfig here; every problem a
user can fix becomes a gr.Error whose message is escaped (``user_error``: Gradio renders it as HTML)."""

from __future__ import annotations

import dataclasses
import html
import threading
from dataclasses import dataclass
from typing import Any

import gradio as gr

from talon import figures as F
from talon.engine.prompt import PromptError
from talon.engine.run import Run
from talon.knobs import APP_KNOBS, KNOB, values_of
from talon.models import ModelLoadError, zerogpu
from talon.models.quant import resolve_target_weights
from talon.run_config import ConfigError, RunConfig
from talon.server import pair as pairs
from talon.server.pair import find_preset, held_key, out_of_memory_as_error, pair_key, server_device
from talon.server.presets import DEFAULT_PRESET, ModelPreset
from talon.settings import DRAFT_QUANTS, INT8_REFUSED, TARGET_WEIGHTS, Settings

Number = int | float  # a slider sends a float for an integer knob (talon.knobs.Knob.read)


@dataclass(frozen=True)
class Controls:
    """The values of the run controls, as the API and the UI send them: the model pair, then every
    knob the app offers under its public name (``talon.knobs``: ``Knob.app``, its default there;
    ``tests/test_knobs.py`` holds these fields equal to the app's knobs), then the weights. All have
    defaults, so an API call may pass the prompt alone."""

    preset: str = DEFAULT_PRESET
    drafter: str = KNOB["drafter"].default
    tree_mode: str = KNOB["tree"].default
    budget: Number = KNOB["budget"].default
    root_k: Number = KNOB["root_k"].default
    top_k: Number = KNOB["top_k"].default
    mu: Number = KNOB["mu"].default
    max_depth: Number = KNOB["max_depth"].default
    min_conf: Number = KNOB["min_conf"].default
    cost_aware: bool = KNOB["cost_aware"].default
    retrieval_threshold: Number = KNOB["graft_threshold"].default
    skip_layers: Number = KNOB["skip_layers"].default
    temperature: Number = KNOB["temperature"].default
    top_p: Number = KNOB["top_p"].default
    seed: Number = KNOB["seed"].default
    max_new_tokens: Number = KNOB["max_new_tokens"].default
    async_draft: bool = KNOB["async_draft"].default
    draft_quant: str = "auto"  # auto: the server's (TALON_DRAFT_QUANT)
    target_weights: str = "auto"  # auto: the server's (TALON_TARGET_WEIGHTS)

    @classmethod
    def from_config(cls, config: dict[str, Any], preset: str = DEFAULT_PRESET) -> Controls:
        """The controls that reproduce a run from its summary's ``config`` (a RunConfig as a dict: a
        trace's ``summary.config``); what it does not name keeps its default."""
        values = values_of(config)
        return cls(preset=preset, **{k.app: values[k.name] for k in APP_KNOBS})

    def to_config(self, max_new_tokens_limit: int) -> RunConfig:
        """The validated RunConfig; raises ConfigError with a message a user can act on."""
        if self.draft_quant not in DRAFT_QUANTS:
            raise ConfigError(f"draft weights must be one of {DRAFT_QUANTS}, got {self.draft_quant!r}")
        if self.target_weights == "int8":
            raise ConfigError(INT8_REFUSED)
        if self.target_weights not in TARGET_WEIGHTS:
            raise ConfigError(f"target weights must be one of {TARGET_WEIGHTS}, got {self.target_weights!r}")
        values = {k.name: getattr(self, k.app) for k in APP_KNOBS}
        return RunConfig().with_knobs(values, app=True, caps={"max_new_tokens": max_new_tokens_limit})


def check_prompt(prompt: Any, settings: Settings) -> str:
    """Cheap checks before any model work (the engine checks the token count)."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise PromptError("the prompt is empty: type some text, or pick an example")
    max_chars = 16 * settings.max_prompt_tokens
    if len(prompt) > max_chars:
        raise PromptError(f"the prompt has {len(prompt)} characters; this server accepts at most {max_chars}")
    return prompt


def user_error(message: str) -> gr.Error:
    """A gr.Error whose message may quote user input: Gradio renders error messages as HTML."""
    return gr.Error(html.escape(F.clean_text(message), quote=False))


@dataclass(frozen=True)
class Job:
    """One run of a user action, validated: what ``decode_on_device`` runs (picklable).
    ``prompt_ids``: the prompt's ids as ``check_job`` checked them on this preset's pair (None
    where it could not: on ZeroGPU with another pair held, the device call checks them)."""

    preset: ModelPreset
    prompt: str
    cfg: RunConfig
    prompt_ids: tuple[int, ...] | None = None


def plan_run(settings: Settings, prompt: Any, controls: Controls, **overrides: Any) -> tuple[ModelPreset, RunConfig]:
    """Validate a request without touching a model (``overrides`` replace RunConfig fields);
    every problem a user can fix becomes a gr.Error with the validator's message."""
    try:
        check_prompt(prompt, settings)
        cfg = controls.to_config(settings.max_new_tokens_limit).replace(**overrides)
        quant = None if controls.draft_quant == "auto" else controls.draft_quant  # auto: TALON_DRAFT_QUANT
        weights = None if controls.target_weights == "auto" else controls.target_weights  # TALON_TARGET_WEIGHTS
        if weights is not None:
            resolve_target_weights(weights, server_device(settings))  # int4: a CPU only
        preset = dataclasses.replace(find_preset(settings, controls.preset), draft_quant=quant, target_weights=weights)
        return preset, cfg
    except (ConfigError, PromptError) as error:
        raise user_error(str(error)) from error


def check_prompt_tokens(settings: Settings, tokens: int) -> None:
    if tokens > settings.max_prompt_tokens:
        raise gr.Error(f"the prompt has {tokens} tokens; this server accepts at most {settings.max_prompt_tokens}")


def open_run(settings: Settings, job: Job, cancel: threading.Event) -> Run:
    """Load the job's models (cached) and start its run, before any forward: the prompt's ids as
    ``check_job`` checked them (the same pair, so the same tokenizer and window), else checked
    now; a model that cannot be loaded or a prompt the server refuses becomes a gr.Error."""
    try:
        run = pairs.load_engine(settings, job.preset).run(job.prompt, job.cfg, cancel, prepared=job.prompt_ids)
    except (ConfigError, PromptError, ModelLoadError) as error:
        raise user_error(str(error)) from error
    if job.prompt_ids is None:
        check_prompt_tokens(settings, len(run.prompt_ids))
    return run


def check_job(settings: Settings, job: Job) -> Job:
    """Every check a user can act on, before any output changes (the prompt, the context window,
    the drafter, the server's prompt limit), done once: the job comes back with the prompt's
    checked ids. Elsewhere the models load here (held); on ZeroGPU no device may be touched in
    this process, so the held pair's tokenizer checks the prompt, and a pair not held here is
    loaded (and checked) in the GPU call."""
    if zerogpu.active():
        if held_key() != pair_key(settings, job.preset):
            return job
        engine = pairs.SLOT.held.engine
    else:
        with out_of_memory_as_error(job.cfg):
            try:
                engine = pairs.load_engine(settings, job.preset)
            except ModelLoadError as error:
                raise user_error(str(error)) from error
    try:
        ids = engine.prepare(job.prompt, job.cfg)
    except (ConfigError, PromptError) as error:
        raise user_error(str(error)) from error
    check_prompt_tokens(settings, len(ids))
    return dataclasses.replace(job, prompt_ids=tuple(ids))


def validate(settings: Settings, requests: list[tuple[str, Controls, dict[str, Any]]]) -> list[Job]:
    """A user action's runs, validated before any of them starts: first every check that needs no
    model (``plan_run``), then every one that does (``check_job``), each run's prompt ids handed on."""
    jobs = []
    for prompt, controls, overrides in requests:
        preset, cfg = plan_run(settings, prompt, controls, **overrides)
        jobs.append(Job(preset, prompt, cfg))
    return [check_job(settings, job) for job in jobs]
