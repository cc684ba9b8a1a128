"""Running on the device: the model loader (the one pair held, ``talon.ui.pair``), the presets
this server offers, and ``DeviceAction``: a user action's runs validated here, then run in one
device call (``decode_on_device``, one ZeroGPU reservation, ``talon.zerogpu``), with recovery
from out-of-memory, cancellation, and what the call learned handed back as plain data."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import math
import threading
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import torch

from talon import zerogpu
from talon.cost import CostModel
from talon.decode import Engine, Run
from talon.prompt import PromptError
from talon.presets import ModelPreset, available_presets, startup_preset
from talon.models import ModelLoadError, gpu_health, load_pair, resolve_device
from talon.models.memory import DTYPE_BYTES, KNOWN_SHAPES, check_fits, estimate_pair
from talon.models.quant import resolve_target_weights
from talon.run_config import MAX_BUDGET, ConfigError, RunConfig
from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET, Settings
from talon.trace import RunSummary, StepTrace
from talon.ui.controls import Controls, check_prompt, user_error
from talon.ui.pair import PairKey, PairSlot, is_out_of_memory

log = logging.getLogger(__name__)

# ZeroGPU reservation per user action: prefill and the cost probe, a pair's load when another pair
# is asked for, then a generous per-token cost, capped.
GPU_BASE_S = 20
GPU_LOAD_S = 60
GPU_PER_TOKEN_S = 0.1
GPU_MAX_S = 300


# ---------------------------------------------------------------------------------------------
# Models: one cached loader
# ---------------------------------------------------------------------------------------------

def build_engine(key: PairKey) -> Engine:
    target_lm, draft_lm = load_pair(key.target, key.draft, key.dtype, key.device, key.allow_remote_code,
                                    key.cache_dir, key.draft_quant, key.target_weights)
    return Engine(target_lm, draft_lm, cost_cache=Path(key.cost_cache) if key.cost_cache else None)


def free_device_bytes(device: str) -> int | None:
    """Bytes free on a CUDA device now (None on a CPU: the guard then has nothing to check)."""
    resolved = resolve_device(device)
    return torch.cuda.mem_get_info(resolved)[0] if resolved.type == "cuda" else None


# the pair this server holds (late-bound, so a test's tripwire or fake sees every call)
SLOT = PairSlot(lambda key: build_engine(key), lambda: release_memory(), lambda device: free_device_bytes(device))


def pair_key(settings: Settings, preset: ModelPreset) -> PairKey:
    """What a preset loads on this server. TALON_DTYPE, when it names a dtype, wins over the preset's."""
    return PairKey(
        target=preset.target or settings.target, draft=preset.draft or settings.draft,
        dtype=settings.dtype if settings.dtype != "auto" else preset.dtype or "auto", device=settings.device,
        draft_quant=preset.draft_quant or settings.draft_quant, allow_remote_code=settings.allow_remote_code,
        cache_dir=str(settings.cache_dir), cost_cache=str(settings.cost_cache_dir),
        target_weights=preset.target_weights or settings.target_weights,
    )


def check_preset_memory(settings: Settings, preset: ModelPreset, dtype: str, available: int) -> None:
    """Refuse, before loading, a GPU preset whose pair would not fit in ``available`` bytes at
    this server's largest settings (longest prompt + most new tokens + the largest tree)."""
    target, draft = KNOWN_SHAPES.get(preset.target or ""), KNOWN_SHAPES.get(preset.draft or "")
    if target is None:
        return  # not a pair whose shape is known without a download
    tokens = settings.max_prompt_tokens + settings.max_new_tokens_limit + MAX_BUDGET + 1
    # a guarded device is a CUDA one, where steps replay as graphs (talon.decode.resolve_step)
    estimate = estimate_pair(target, draft, dtype if dtype in DTYPE_BYTES else "bfloat16", tokens, graphs=True)
    check_fits(estimate, available, preset.label, preset.gpu_gib)


def load_engine(settings: Settings, preset: ModelPreset, guarded: bool = True) -> Engine:
    """The engine for a preset: the pair held now, or, after releasing it, this one (one pair at a
    time; loads are serialised). A pair that fails to load leaves the previous pair, or the
    start-up pair, held again; the ModelLoadError says what happened. ``guarded``: check the
    device's free memory first (not for ZeroGPU's start-up load, where no device may be asked)."""
    key = pair_key(settings, preset)

    def guard(free: int | None) -> None:
        if free is not None and preset.needs_cuda:
            check_preset_memory(settings, preset, key.dtype, free)

    fallback = pair_key(settings, find_preset(settings, initial_preset(settings)))
    return SLOT.get(key, guard if guarded else None, fallback)


def server_notices() -> list[str]:
    """What every visitor should know about this server before a run (plain sentences): a GPU
    that is present but unusable, and ZeroGPU's shared slots."""
    notices = []
    if (unusable := gpu_health.unusable_gpu()) is not None:
        notices.append(unusable)
    if zerogpu.active():
        notices.append("This Space runs on ZeroGPU: each run (a decode with its baseline, a Compare, a sweep, "
                       "a recording) waits for a shared GPU slot, then holds it for the seconds it asks for, "
                       "counted against your daily GPU quota. Other model pairs than the start-up one load "
                       "inside that slot, so their runs take longer.")
    return notices


def warm_up(settings: Settings) -> None:
    """Load the start-up pair now: from a background thread at start, or on ZeroGPU on the main
    thread before launch (ZeroGPU records the weights moved to cuda there). Errors are logged
    here and shown to the user on their first run."""
    try:
        load_engine(settings, find_preset(settings, initial_preset(settings)), guarded=not zerogpu.active())
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
# A request: validated before any forward
# ---------------------------------------------------------------------------------------------


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


def server_device(settings: Settings) -> torch.device:
    """The device TALON_DEVICE names (auto: CUDA when torch sees one), without checking it exists:
    the loader says what is wrong with a device that does not."""
    name = settings.device.strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(name)
    except RuntimeError:
        return torch.device("cpu")


def check_prompt_tokens(settings: Settings, tokens: int) -> None:
    if tokens > settings.max_prompt_tokens:
        raise gr.Error(f"the prompt has {tokens} tokens; this server accepts at most {settings.max_prompt_tokens}")


def open_run(settings: Settings, preset: ModelPreset, prompt: str, cfg: RunConfig, cancel: threading.Event) -> Run:
    """Load the preset's models (cached) and start a run, before any forward: a model that cannot
    be loaded or a prompt the server refuses becomes a gr.Error that says why."""
    try:
        run = load_engine(settings, preset).run(prompt, cfg, cancel)
    except (ConfigError, PromptError, ModelLoadError) as error:
        raise user_error(str(error)) from error
    check_prompt_tokens(settings, len(run.prompt_ids))
    return run


# ---------------------------------------------------------------------------------------------
# Running on the device: one call (one ZeroGPU reservation) per user action, out-of-memory
# ---------------------------------------------------------------------------------------------


on_gpu = zerogpu.gpu  # spaces.GPU(duration=...) where spaces is importable; see talon.zerogpu


@dataclass(frozen=True)
class Job:
    """One run of a user action, validated: what ``decode_on_device`` runs (picklable)."""

    preset: ModelPreset
    prompt: str
    cfg: RunConfig


@dataclass(frozen=True)
class Learned:
    """What a device call learned, handed back as plain data (on ZeroGPU the call runs in a
    forked worker whose Python state never comes back): the pair's cost curves by draft vocabulary."""

    key: PairKey
    costs: dict[int, dict[str, Any]]


def held_key() -> PairKey | None:
    return SLOT.held.key if SLOT.held is not None else None


def gpu_seconds(settings: Settings, jobs: list[Job], cancel_id: str = "") -> int:
    """GPU seconds to reserve for one user action (same arguments as ``decode_on_device``): a base
    for prefill and the cost probe, a per-token cost of each run's max_new_tokens, and a load
    when a run needs a pair other than the one held, capped at GPU_MAX_S."""
    tokens = sum(job.cfg.max_new_tokens for job in jobs)
    load = any(pair_key(settings, job.preset) != held_key() for job in jobs)
    return min(GPU_MAX_S, math.ceil(GPU_BASE_S + GPU_LOAD_S * load + GPU_PER_TOKEN_S * tokens))


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


# cancel_id -> the action's Stop flag. decode_on_device takes the id, not the Event: on ZeroGPU its
# arguments are pickled into a GPU worker process (where the id finds nothing; see DeviceAction).
_CANCELS: dict[str, threading.Event] = {}
_CANCELS_LOCK = threading.Lock()


@on_gpu(duration=gpu_seconds)
def decode_on_device(
    settings: Settings, jobs: list[Job], cancel_id: str = ""
) -> Iterator[tuple[int, StepTrace | RunSummary] | Learned]:
    """Run a user action's jobs in turn, in one device call: yields ``(job index, StepTrace)``
    items, ``(job index, RunSummary)`` when a job ends, then what the call learned. Takes and
    yields only picklable values, and every failure a user can act on leaves it as a gr.Error."""
    cancel = _CANCELS.get(cancel_id) or threading.Event()
    engine = None
    for index, job in enumerate(jobs):
        if cancel.is_set() and index > 0:  # stopped: the first run still ends with its summary
            break
        with out_of_memory_as_error(job.cfg):
            run = open_run(settings, job.preset, job.prompt, job.cfg, cancel)
            engine = run.engine
            for step in run:
                yield index, step
        assert run.summary is not None
        if run.costs is not None and not run.fixed_costs and not cancel.is_set():
            if job.cfg.needs_draft_model or not job.cfg.uses_model:  # a view's curves stay its own
                engine.adopt_costs(run.costs, job.cfg.draft_vocab)  # learn mode: the next run starts from these
        yield index, run.summary
    if engine is not None:  # the last run's pair is the one held now
        yield Learned(pair_key(settings, job.preset), {v: c.to_dict() for v, c in engine.cost_snapshots().items()})


def adopt_learned(learned: Learned) -> None:
    """In the server process: keep what a device call learned for the pair held here (on ZeroGPU
    the next forked worker starts from it; elsewhere it is the same engine, and nothing changes)."""
    if SLOT.held is not None and SLOT.held.key == learned.key:
        for vocab, data in learned.costs.items():
            SLOT.held.engine.adopt_costs(CostModel.from_dict(data), vocab)


# ---------------------------------------------------------------------------------------------
# A user action: every run validated here, then all of them in one device call
# ---------------------------------------------------------------------------------------------


def check_job(settings: Settings, job: Job) -> None:
    """Every check a user can act on, before any output changes (the prompt, the context window,
    the drafter, the server's prompt limit). Elsewhere the models load here (held); on ZeroGPU no
    device may be touched in this process, so the held pair's tokenizer checks the prompt, and a
    pair not held here is loaded (and checked) in the GPU call."""
    if zerogpu.active():
        if held_key() != pair_key(settings, job.preset):
            return
        engine = SLOT.held.engine
    else:
        with out_of_memory_as_error(job.cfg):
            try:
                engine = load_engine(settings, job.preset)
            except ModelLoadError as error:
                raise user_error(str(error)) from error
    try:
        ids = engine.prepare(job.prompt, job.cfg)
    except (ConfigError, PromptError) as error:
        raise user_error(str(error)) from error
    check_prompt_tokens(settings, len(ids))


class DeviceAction:
    """One user action (a decode with its baseline, a Compare, a sweep): its runs validated when
    it is made, so every error a user can fix is raised before any output changes; then run in
    one ``decode_on_device`` call. ``runs[i]`` iterates run i's StepTraces (in order: run i+1
    starts where run i ends); ``runs[i].summary`` is set when it ends."""

    def __init__(self, settings: Settings, requests: list[tuple[str, Controls, dict[str, Any]]],
                 cancel: threading.Event) -> None:
        self.jobs = []
        for prompt, controls, overrides in requests:
            preset, cfg = plan_run(settings, prompt, controls, **overrides)
            self.jobs.append(Job(preset, prompt, cfg))
        for job in self.jobs:
            check_job(settings, job)
        self.settings, self.cancel = settings, cancel
        self.summaries: list[RunSummary | None] = [None] * len(self.jobs)
        self.runs = [ActionRun(self, i) for i in range(len(self.jobs))]
        self._items: Iterator[tuple[int, StepTrace | RunSummary]] | None = None

    @property
    def gpu_seconds(self) -> int:
        return gpu_seconds(self.settings, self.jobs)

    def steps(self, index: int) -> Iterator[StepTrace]:
        """Run ``index``'s steps, pulling the shared stream until its summary arrives."""
        if self._items is None:
            self._items = self._stream()
        try:
            for i, item in self._items:
                if isinstance(item, RunSummary):
                    self.summaries[i] = item
                    if i == len(self.jobs) - 1:
                        for _ in self._items:  # what the call learned; then the call is closed
                            pass
                    if i >= index:
                        return
                elif i == index:
                    yield item
        except GeneratorExit:  # the handler was closed (Stop, a closed page): end the device call too
            self._items.close()
            raise

    def finish(self) -> None:
        """Run whatever is left (a baseline after the streamed run), then close the device call."""
        for _ in self.steps(len(self.jobs)):
            pass

    def _stream(self) -> Iterator[tuple[int, StepTrace | RunSummary]]:
        cancel_id = uuid.uuid4().hex
        with _CANCELS_LOCK:
            _CANCELS[cancel_id] = self.cancel
        items = decode_on_device(self.settings, self.jobs, cancel_id)
        stop_seen = False
        try:
            for item in items:
                if isinstance(item, Learned):
                    if zerogpu.active():  # elsewhere the call ran in this process: its engine has learned
                        adopt_learned(item)
                elif isinstance(item[1], RunSummary):
                    yield item
                elif stop_seen:  # a run that cannot see the flag (ZeroGPU worker) ends when closed
                    break
                else:
                    stop_seen = self.cancel.is_set()
                    yield item
        finally:
            items.close()
            with _CANCELS_LOCK:
                _CANCELS.pop(cancel_id, None)


def start_status(action: DeviceAction) -> str:
    """The status line while an action starts: on ZeroGPU it first waits for a GPU slot."""
    return zerogpu.waiting_note(action.gpu_seconds) if zerogpu.active() else "running…"


class ActionRun:
    """Run ``index`` of a DeviceAction: iterate it for StepTraces; ``summary`` when it ended."""

    def __init__(self, action: DeviceAction, index: int) -> None:
        self.action, self.index = action, index
        self.preset, self.cfg = action.jobs[index].preset, action.jobs[index].cfg

    @property
    def summary(self) -> RunSummary | None:
        return self.action.summaries[self.index]

    def __iter__(self) -> Iterator[StepTrace]:
        return self.action.steps(self.index)


def DeviceRun(settings: Settings, prompt: str, controls: Controls, cancel: threading.Event,  # noqa: N802
              **overrides: Any) -> ActionRun:
    """A user action of one run (validated now): iterate it for StepTraces; ``summary`` at the end."""
    return DeviceAction(settings, [(prompt, controls, overrides)], cancel).runs[0]
