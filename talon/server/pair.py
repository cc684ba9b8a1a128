"""The model pair this server holds, and the presets it offers: which pair a preset loads
(``pair_key``), the memory guard (``check_preset_memory``), the one pair held (``SLOT``, a
``PairSlot``: release before load, fall back on failure), the start-up load
(``warm_up``), and out-of-memory turned into an error a user can act on, with the memory freed."""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import torch

from talon.engine.build import PairKey, build_engine
from talon.engine.engine import Engine
from talon.knobs import HEAD_PAIR_KINDS, MODEL_PAIR_KINDS, slot_kind
from talon.models import ModelLoadError, gpu_health, resolve_device, zerogpu
from talon.models.eagle3 import read_head_config
from talon.models.embedded import EMBEDDED_MODELS
from talon.models.memory import DTYPE_BYTES, KNOWN_SHAPES, check_fits
from talon.run_config import ConfigError, RunConfig
from talon.server import offer
from talon.server.presets import PRESETS, ModelPreset, available_presets, startup_preset
from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET, Settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Held:
    key: PairKey
    engine: Any  # talon.engine.engine.Engine (a fake in tests)


def is_out_of_memory(error: BaseException) -> bool:
    """A device (or host) allocation failure: torch's OutOfMemoryError or a RuntimeError saying so."""
    text = str(error).lower()
    return isinstance(error, torch.cuda.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)
    )


class PairSlot:
    """Holds at most one engine. ``get(key, guard, fallback)`` returns the engine for ``key``,
    switching to it if another pair is held. ``guard(free_bytes)`` is called after the release
    with the bytes really free (None where the device cannot say, e.g. a CPU) and raises
    ModelLoadError when the pair would not fit. ``fallback`` is the start-up pair's key."""

    def __init__(
        self,
        build: Callable[[PairKey], Any],
        release: Callable[[], None],
        free_bytes: Callable[[str], int | None],
    ) -> None:
        self._build, self._release, self._free_bytes = build, release, free_bytes
        self._lock = threading.Lock()  # loads are serialised: one pair on the device at a time
        self.held: Held | None = None
        self.loading: PairKey | None = None  # the pair being loaded now, for the status every page shows
        self.switched = ""  # when the held pair last replaced another, for every open page

    def get(self, key: PairKey, guard: Callable[[int | None], None] | None = None,
            fallback: PairKey | None = None) -> Any:
        with self._lock:
            if self.held is not None and self.held.key == key:
                return self.held.engine
            previous = self.held.key if self.held is not None else None
            try:
                return self._switch(key, guard)
            except (ModelLoadError, OSError) as error:
                holds = self._recover([k for k in (previous, fallback) if k is not None and k != key])
                raise ModelLoadError(f"{error} {holds}") from error

    def drop(self) -> None:
        """Release the pair held now (its weights, then the device's cache)."""
        held, self.held = self.held, None
        if held is not None:
            logger.info("releasing %s", held.key.describe())
            del held
            self._release()

    def _switch(self, key: PairKey, guard: Callable[[int | None], None] | None) -> Any:
        previous = self.held.key if self.held is not None else None
        self.drop()
        if guard is not None:
            guard(self._free_bytes(key.device))
        self.loading = key
        try:
            engine = self._build(key)
        except RuntimeError as error:
            if not is_out_of_memory(error):
                raise
            self._release()
            raise ModelLoadError(f"{key.describe()} did not fit in the device's memory while loading "
                                 f"({error}).") from None
        finally:
            self.loading = None
        self.held = Held(key, engine)
        if previous is not None:
            self.switched = f"{time.strftime('%H:%M')} UTC: the server switched from {pair_words(previous)}"
        logger.info("holding %s", key.describe())
        return engine

    def _recover(self, candidates: list[PairKey]) -> str:
        """Load the first candidate that loads; the sentence that says what the server holds."""
        self.drop()
        for key in candidates:
            try:
                self._switch(key, None)
                return f"The server is back on {key.describe()}."
            except (ModelLoadError, OSError, RuntimeError) as error:
                logger.error("could not load %s again: %s", key.describe(), error)
                self.drop()
        return "The server holds no model pair now; pick a preset to load one."


def free_device_bytes(device: str) -> int | None:
    """Bytes free on a CUDA device now (None on a CPU: the guard then has nothing to check)."""
    resolved = resolve_device(device)
    return torch.cuda.mem_get_info(resolved)[0] if resolved.type == "cuda" else None


# the pair this server holds (late-bound, so a test's tripwire or fake sees every call)
SLOT = PairSlot(lambda key: build_engine(key), lambda: release_memory(), lambda device: free_device_bytes(device))


def pair_key(settings: Settings, preset: ModelPreset) -> PairKey:
    """What a preset loads on this server. TALON_DTYPE, when it names a dtype, wins over the preset's."""
    return PairKey.from_settings(
        settings, target=preset.target or settings.target, draft=preset.draft or settings.draft,
        dtype=settings.dtype if settings.dtype != "auto" else preset.dtype or "auto",
        draft_quant=preset.draft_quant or settings.draft_quant,
        target_weights=preset.target_weights or settings.target_weights,
    )


def check_preset_memory(settings: Settings, preset: ModelPreset, dtype: str, available: int) -> None:
    """Refuse, before loading, a GPU preset whose pair would not fit in ``available`` bytes at
    this server's largest settings (``talon.server.offer.preset_estimate``)."""
    estimate = offer.preset_estimate(settings, preset, dtype)
    if estimate is not None:  # None: not a pair whose shape is known without a download
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


def held_key() -> PairKey | None:
    return SLOT.held.key if SLOT.held is not None else None


def pair_words(key: PairKey) -> str:
    """A pair as a status line names it: its models' short names and, where known without a
    download, the size of their weights."""
    names = " + ".join(model_short_name(m) for m in (key.target, key.draft) if m and m != "none")
    models = [m for m in (key.target, key.draft) if m and m != "none"]
    if all(m in EMBEDDED_MODELS for m in models):
        return f"{names} ({sum(EMBEDDED_MODELS[m].size for m in models) / 1e9:.1f} GB of GGUF weights)"
    shapes = [KNOWN_SHAPES.get(m) for m in models]
    if all(shapes):
        size = sum(shape.parameters for shape in shapes if shape) * DTYPE_BYTES.get(key.dtype, 2)
        return f"{names} ({size / 1e9:.1f} GB of weights)"
    return names


def pair_status() -> str:
    """What every page's status line says about the models: loading (which, how large), held,
    or none; and the last switch of the held pair."""
    if (loading := SLOT.loading) is not None:
        now = f"Loading the models: {pair_words(loading)}. Runs start when they are ready."
    elif SLOT.held is not None:
        now = f"Models ready: {pair_words(SLOT.held.key)}."
    else:
        now = "No model pair is loaded yet; the first run loads it."
    return f"{now} {SLOT.switched}." if SLOT.switched else now


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
        logger.error("could not pre-load the models: %s", error)
        release_memory()


def cuda_available() -> bool:
    return torch.cuda.is_available()


def _device_presets(settings: Settings) -> list[ModelPreset]:
    """The presets this device kind runs: the GPU pairs only with CUDA and TALON_DEVICE not cpu."""
    return available_presets(cuda_available() and not settings.device.startswith("cpu"))


def _refusals(settings: Settings) -> dict[str, str]:
    """Preset key -> why this server cannot run it (``talon.server.offer.refusal``)."""
    kinds = _device_presets(settings)
    total = offer.gpu_total_bytes(settings) if any(p.needs_cuda for p in kinds) else None
    return {p.key: why for p in kinds if (why := offer.refusal(settings, p, total)) is not None}


def presets(settings: Settings) -> list[ModelPreset]:
    """The presets this server offers: those its device holds, among the ones TALON_PRESETS names."""
    refused = _refusals(settings)
    return offer.chosen(settings, [p for p in _device_presets(settings) if p.key not in refused])


def unoffered(settings: Settings) -> list[tuple[ModelPreset, str]]:
    """The presets TALON_PRESETS would offer that this server cannot run, with the reason."""
    refused = _refusals(settings)
    return [(p, refused[p.key]) for p in offer.chosen(settings, _device_presets(settings)) if p.key in refused]


def visitor_presets(settings: Settings) -> list[ModelPreset]:
    """What a visitor may pick: every offered preset, or, where the owner picks the pair
    (TALON_PRESET_SWITCH=owner), the held one alone."""
    offered = presets(settings)
    if switch_policy(settings) == "owner":
        return [p for p in offered if p.key == initial_preset(settings)]
    return offered


def switch_policy(settings: Settings) -> str:
    return offer.who_switches(settings, any(p.needs_cuda for p in _device_presets(settings)))


def model_short_name(name: str) -> str:
    """A model's name as a menu shows it: the last part of a Hub id, path or ``embedded:`` name."""
    tail = name.rstrip("/").replace("\\", "/").split("/")[-1].split(":")[-1]
    return tail.removesuffix(".gguf")


def preset_label(preset: ModelPreset, settings: Settings) -> str:
    """The Models menu's entry: the default pair named by its models (the built-in pair, or the
    server's TALON_TARGET / TALON_DRAFT), the GPU presets by their own labels."""
    if preset.target is not None or preset.needs_cuda:
        return preset.label
    if (settings.target, settings.draft) == (EMBEDDED_TARGET, EMBEDDED_DRAFT):
        return "Qwen2.5-Coder 1.5B + 0.5B"  # the narrow column shows about 27 characters
    draft = model_short_name(settings.draft) if settings.draft else "no draft model"
    return f"Server pair: {model_short_name(settings.target)} + {draft}"


def initial_preset(settings: Settings) -> str:
    """The preset selected (and loaded) at start: TALON_PRESET, else
    ``talon.server.presets.startup_preset`` where offered, else the first offered."""
    offered = [p.key for p in presets(settings)]
    if settings.preset:
        if settings.preset not in offered:
            raise ConfigError(f"TALON_PRESET {settings.preset!r} cannot be held here: {_why_not(settings, offered)}")
        return settings.preset
    gpu = any(p.needs_cuda for p in _device_presets(settings))
    start = startup_preset(gpu, (settings.target, settings.draft) != (EMBEDDED_TARGET, EMBEDDED_DRAFT))
    if start in offered or not offered:
        return start
    return offered[0]


def holds_head(settings: Settings, preset: ModelPreset) -> bool:
    """Does ``preset`` put an EAGLE-3 head in the draft slot (a head preset, or the server's own
    pair with TALON_DRAFT a head's directory)?"""
    if preset.head:
        return True
    draft = Path(settings.draft).expanduser() if preset.target is None and settings.draft else None
    return draft is not None and draft.is_dir() and read_head_config(draft) is not None


def drafter_choices(settings: Settings, key: str, current: str = "") -> tuple[tuple[str, ...], str]:
    """The drafter kinds the app offers for preset ``key`` (a head's kinds where the draft slot
    holds one, a draft model's elsewhere), and the choice to show: ``current`` where offered, else
    its counterpart (hybrid and eagle3-hybrid, model and eagle3), else the first."""
    head = holds_head(settings, find_preset(settings, key))
    offered = HEAD_PAIR_KINDS if head else MODEL_PAIR_KINDS
    return offered, slot_kind(head, offered, current)


def _why_not(settings: Settings, offered: list[str]) -> str:
    """Why TALON_PRESET is not among the ``offered`` preset keys."""
    key = settings.preset
    if key not in {p.key for p in PRESETS}:
        return f"there is no such preset; the presets: {[p.key for p in PRESETS]}"
    if key not in {p.key for p in _device_presets(settings)}:
        return "it needs a CUDA GPU, and this server runs on a CPU"
    return _refusals(settings).get(key, f"TALON_PRESETS offers only {offered}")


def find_preset(settings: Settings, key: str) -> ModelPreset:
    """The preset ``key`` names, if a visitor may run it here; else a ConfigError that says why."""
    offered = visitor_presets(settings)
    for preset in offered:
        if preset.key == key:
            return preset
    why = _refusals(settings).get(key)
    if why is not None:
        raise ConfigError(f"the model preset {key!r} cannot run on this server: {why}")
    if key in {p.key for p in presets(settings)}:  # offered, but the owner picks the pair
        held = offered[0].label if offered else "none"
        raise ConfigError(f"this Space runs one model pair, {held}: its owner picks it (TALON_PRESET), and visitors "
                          f"do not switch it (TALON_PRESET_SWITCH=owner), so no visitor unloads another's pair")
    raise ConfigError(f"model preset must be one of {[p.key for p in offered]} on this server, got {key!r}")


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
        logger.warning("out of memory (budget %d, max_new_tokens %d): %s", cfg.tree.budget, cfg.max_new_tokens, error)
        traceback.clear_frames(error.__traceback__)
        release_memory()
        raise gr.Error(
            f"the device ran out of memory (budget N {cfg.tree.budget}, max new tokens {cfg.max_new_tokens}): "
            "try a smaller budget, fewer new tokens, a shorter prompt or a smaller model pair. "
            "The memory was freed; you can run again."
        ) from None
