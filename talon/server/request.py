"""One request, validated before any forward (``validate``): the controls into a preset and a RunConfig
(``plan_run``), then every check a user can act on (``check_job``: the prompt, the context
window, the drafter, the server's prompt limit), so every error a user can fix is raised
before any output changes. ``Job`` is the result, handed on to the device call. The run controls
as the UI and the API send them (``Controls``) are validated into a RunConfig here; every problem a
user can fix becomes a gr.Error whose message is escaped (``user_error``: Gradio renders it as HTML)."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any

import gradio as gr

from talon.engine.prompt import PromptError
from talon.engine.run import Run
from talon.models import ModelLoadError, zerogpu
from talon.models.quant import resolve_target_weights
from talon.run_config import ConfigError, RunConfig
from talon.server import pair as pairs
from talon.server.controls import Controls, RunRequest, user_error
from talon.server.offer import find_preset
from talon.server.pair import held_key, out_of_memory_as_error, pair_key, server_device
from talon.server.presets import ModelPreset
from talon.settings import Settings


def check_prompt(prompt: Any, settings: Settings) -> str:
    """Cheap checks before any model work (the engine checks the token count)."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise PromptError("the prompt is empty: type some text, or pick an example")
    max_chars = 16 * settings.max_prompt_tokens
    if len(prompt) > max_chars:
        raise PromptError(f"the prompt has {len(prompt)} characters; this server accepts at most {max_chars}")
    return prompt


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


def validate(settings: Settings, requests: list[RunRequest]) -> list[Job]:
    """A user action's runs, validated before any of them starts: first every check that needs no
    model (``plan_run``), then every one that does (``check_job``), each run's prompt ids handed on."""
    jobs = []
    for request in requests:
        prompt, controls, overrides = request.prompt, request.controls, request.overrides
        preset, cfg = plan_run(settings, prompt, controls, **overrides)
        jobs.append(Job(preset, prompt, cfg))
    return [check_job(settings, job) for job in jobs]
