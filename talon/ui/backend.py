"""Running on the device: the one cached model loader (one pair at a time, loads serialised),
the presets this server offers, a ZeroGPU reservation per run (``spaces.GPU``), recovery from
out-of-memory, cancellation, and ``DeviceRun``, which every tab iterates for StepTraces."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import logging
import math
import threading
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gradio as gr
import torch

from talon.decode import Engine, PromptError, Run
from talon.examples import ModelPreset, available_presets, startup_preset
from talon.models import ModelLoadError, load_pair, resolve_device
from talon.models.memory import DTYPE_BYTES, KNOWN_SHAPES, check_fits, estimate_pair
from talon.run_config import MAX_BUDGET, ConfigError, RunConfig
from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET, Settings
from talon.trace import RunSummary, StepTrace
from talon.ui.controls import Controls, check_prompt, user_error

try:  # Hugging Face ZeroGPU: installed on Spaces, absent elsewhere (see on_gpu)
    import spaces
except ImportError:
    spaces = None

log = logging.getLogger(__name__)

# ZeroGPU reservation per run: loading and prefill, then a generous per-token cost, capped.
GPU_BASE_S = 20
GPU_PER_TOKEN_S = 0.1
GPU_MAX_S = 300


# ---------------------------------------------------------------------------------------------
# Models: one cached loader
# ---------------------------------------------------------------------------------------------

_LOAD_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def _cached_engine(
    target: str, draft: str, dtype: str, device: str, allow_remote_code: bool, cache_dir: str,
    draft_quant: str = "auto", cost_cache: str = "",
) -> Engine:
    target_lm, draft_lm = load_pair(target, draft, dtype, device, allow_remote_code, cache_dir, draft_quant)
    return Engine(target_lm, draft_lm, cost_cache=Path(cost_cache) if cost_cache else None)


_LOADED: dict[str, Any] = {}  # the pair held now ("key") and its weights' bytes, freed on a switch


def engine_bytes(engine: Engine) -> int:
    models = [lm.model for lm in (engine.target, engine.draft) if lm is not None]
    return sum(p.numel() * p.element_size() for m in models for p in m.parameters())


def check_preset_memory(settings: Settings, preset: ModelPreset, dtype: str, available: int) -> None:
    """Refuse, before loading, a GPU preset whose pair would not fit in ``available`` bytes at
    this server's largest settings (longest prompt + most new tokens + the largest tree)."""
    target, draft = KNOWN_SHAPES.get(preset.target or ""), KNOWN_SHAPES.get(preset.draft or "")
    if target is None:
        return  # not a pair whose shape is known without a download
    tokens = settings.max_prompt_tokens + settings.max_new_tokens_limit + MAX_BUDGET + 1
    estimate = estimate_pair(target, draft, dtype if dtype in DTYPE_BYTES else "bfloat16", tokens)
    check_fits(estimate, available, preset.label, preset.gpu_gib)


def load_engine(settings: Settings, preset: ModelPreset) -> Engine:
    """The engine for a preset, loaded once and kept (one pair at a time; loads are serialised).
    TALON_DTYPE, when it names a dtype, wins over the preset's."""
    target, draft = preset.target or settings.target, preset.draft or settings.draft
    dtype = settings.dtype if settings.dtype != "auto" else preset.dtype or "auto"
    quant = preset.draft_quant or settings.draft_quant
    with _LOAD_LOCK:
        key = (target, draft, dtype, settings.device)
        device = resolve_device(settings.device)
        if key != _LOADED.get("key") and preset.needs_cuda and device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            check_preset_memory(settings, preset, dtype, free + _LOADED.get("bytes", 0))
        engine = _cached_engine(
            target, draft, dtype, settings.device, settings.allow_remote_code, str(settings.cache_dir), quant,
            str(settings.cost_cache_dir),
        )
        if key != _LOADED.get("key"):
            _LOADED.update(key=key, bytes=engine_bytes(engine))
        return engine


def warm_up(settings: Settings) -> None:
    """Load the start-up pair now (call from a background thread at start); errors are logged
    here and shown to the user on their first run."""
    try:
        load_engine(settings, find_preset(settings, initial_preset(settings)))
    except (ModelLoadError, ConfigError, OSError, torch.cuda.OutOfMemoryError) as error:
        log.error("could not pre-load the models: %s", error)
        release_memory()


def cuda_available() -> bool:
    return torch.cuda.is_available()


def presets(settings: Settings) -> list[ModelPreset]:
    """The presets this server offers: the GPU pairs only with CUDA and TALON_DEVICE not cpu."""
    return available_presets(cuda_available() and not settings.device.startswith("cpu"))


def initial_preset(settings: Settings) -> str:
    """The preset selected (and loaded) at start; see ``talon.examples.startup_preset``."""
    gpu = any(p.needs_cuda for p in presets(settings))
    return startup_preset(gpu, (settings.target, settings.draft) != (EMBEDDED_TARGET, EMBEDDED_DRAFT))


def find_preset(settings: Settings, key: str) -> ModelPreset:
    offered = presets(settings)
    for preset in offered:
        if preset.key == key:
            return preset
    raise ConfigError(f"model preset must be one of {[p.key for p in offered]} on this server, got {key!r}")


# ---------------------------------------------------------------------------------------------
# A request: validated, then opened (models loaded, prompt checked) before any forward
# ---------------------------------------------------------------------------------------------


def plan_run(settings: Settings, prompt: Any, controls: Controls, **overrides: Any) -> tuple[ModelPreset, RunConfig]:
    """Validate a request without touching a model (``overrides`` replace RunConfig fields);
    every problem a user can fix becomes a gr.Error with the validator's message."""
    try:
        check_prompt(prompt, settings)
        cfg = controls.run_config(settings.max_new_tokens_limit).replace(**overrides)
        quant = None if controls.draft_quant == "auto" else controls.draft_quant  # auto: TALON_DRAFT_QUANT
        preset = dataclasses.replace(find_preset(settings, controls.preset), draft_quant=quant)
        return preset, cfg
    except (ConfigError, PromptError) as error:
        raise user_error(str(error)) from error


def open_run(settings: Settings, preset: ModelPreset, prompt: str, cfg: RunConfig, cancel: threading.Event) -> Run:
    """Load the preset's models (cached) and start a run, before any forward: a model that cannot
    be loaded or a prompt the server refuses becomes a gr.Error that says why."""
    try:
        run = load_engine(settings, preset).run(prompt, cfg, cancel)
    except (ConfigError, PromptError, ModelLoadError) as error:
        raise user_error(str(error)) from error
    if len(run.prompt_ids) > settings.max_prompt_tokens:
        raise gr.Error(
            f"the prompt has {len(run.prompt_ids)} tokens; this server accepts at most {settings.max_prompt_tokens}"
        )
    return run


# ---------------------------------------------------------------------------------------------
# Running on the device: a ZeroGPU reservation per run, recovery from out-of-memory
# ---------------------------------------------------------------------------------------------


def on_gpu(duration: Callable[..., int]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``spaces.GPU(duration=duration)`` where the ``spaces`` package is importable: on ZeroGPU it
    reserves a GPU for each call, for the seconds ``duration`` computes from the call's own
    arguments. Elsewhere the function is returned unchanged."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        return fn if spaces is None else spaces.GPU(duration=duration)(fn)

    return decorate


def gpu_seconds(settings: Settings, preset: ModelPreset, prompt: str, cfg: RunConfig, cancel_id: str) -> int:
    """GPU seconds to reserve for one run (same arguments as ``decode_on_device``): a base for
    loading and prefill plus a per-token cost of max_new_tokens, capped at GPU_MAX_S."""
    return min(GPU_MAX_S, math.ceil(GPU_BASE_S + GPU_PER_TOKEN_S * cfg.max_new_tokens))


def is_out_of_memory(error: BaseException) -> bool:
    """A device (or host) allocation failure: torch's OutOfMemoryError or a RuntimeError saying so."""
    text = str(error).lower()
    return isinstance(error, torch.cuda.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)
    )


def release_memory() -> None:
    """Return freed tensors to the device: collect garbage, then empty CUDA's caching allocator."""
    gc.collect()
    if cuda_available():
        torch.cuda.empty_cache()


@contextlib.contextmanager
def out_of_memory_as_error(cfg: RunConfig) -> Iterator[None]:
    """Turn running out of memory into a gr.Error that says what to shrink, after freeing what the
    failed run held (its frames are cleared, so its caches can go), so the server keeps serving."""
    try:
        yield
    except RuntimeError as error:
        if not is_out_of_memory(error):
            raise
        log.warning("out of memory (budget %d, max_new_tokens %d): %s", cfg.tree.budget, cfg.max_new_tokens, error)
        traceback.clear_frames(error.__traceback__)
        release_memory()
        raise gr.Error(
            f"the device ran out of memory (budget N {cfg.tree.budget}, max new tokens {cfg.max_new_tokens}): "
            "try a smaller budget, fewer new tokens, a shorter prompt or a smaller model pair. "
            "The memory was freed; you can run again."
        ) from None


# cancel_id -> the run's Stop flag. decode_on_device takes the id, not the Event: on ZeroGPU its
# arguments are pickled into a GPU worker process (where the id finds nothing; see DeviceRun).
_CANCELS: dict[str, threading.Event] = {}
_CANCELS_LOCK = threading.Lock()


@on_gpu(duration=gpu_seconds)
def decode_on_device(
    settings: Settings, preset: ModelPreset, prompt: str, cfg: RunConfig, cancel_id: str
) -> Iterator[StepTrace | RunSummary]:
    """Run a planned request: yields its StepTraces, then its RunSummary. Takes and yields only
    picklable values, and every failure a user can act on leaves it as a gr.Error."""
    with out_of_memory_as_error(cfg):
        yield from _decode(settings, preset, prompt, cfg, _CANCELS.get(cancel_id) or threading.Event())


def _decode(
    settings: Settings, preset: ModelPreset, prompt: str, cfg: RunConfig, cancel: threading.Event
) -> Iterator[StepTrace | RunSummary]:
    run = open_run(settings, preset, prompt, cfg, cancel)
    yield from run
    assert run.summary is not None
    if run.costs is not None and not run.fixed_costs and not cancel.is_set():
        run.engine.adopt_costs(run.costs, cfg.draft_vocab)  # learn mode: the next run starts from these curves
    yield run.summary


class DeviceRun:
    """One validated run, executed by ``decode_on_device``: iterate it for StepTraces; ``summary``
    is set at the end. Creating it validates the request and loads the models here, in the
    server process, so every error a user can fix is raised before any output changes."""

    def __init__(
        self, settings: Settings, prompt: str, controls: Controls, cancel: threading.Event, **overrides: Any
    ) -> None:
        self.preset, self.cfg = plan_run(settings, prompt, controls, **overrides)
        with out_of_memory_as_error(self.cfg):
            open_run(settings, self.preset, prompt, self.cfg, cancel)  # checks only; nothing runs yet
        self.settings, self.prompt, self.cancel = settings, prompt, cancel
        self.summary: RunSummary | None = None

    def __iter__(self) -> Iterator[StepTrace]:
        cancel_id = uuid.uuid4().hex
        with _CANCELS_LOCK:
            _CANCELS[cancel_id] = self.cancel
        items = decode_on_device(self.settings, self.preset, self.prompt, self.cfg, cancel_id)
        stop_seen = False
        try:
            for item in items:
                if isinstance(item, RunSummary):
                    self.summary = item
                elif stop_seen:  # a run that cannot see the flag (ZeroGPU worker) ends when closed
                    break
                else:
                    stop_seen = self.cancel.is_set()
                    yield item
        finally:
            items.close()
            with _CANCELS_LOCK:
                _CANCELS.pop(cancel_id, None)
