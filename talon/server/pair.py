"""The model pair this server holds (the slot): which pair a preset loads (``pair_key``), the
memory guard (``check_preset_memory``), the one pair held (``SLOT``, a ``PairSlot``: release
before load, fall back on failure), the start-up load (``load_startup_pair``), and out-of-memory turned
into an error a user can act on, with the memory freed. Which presets a server offers and who
switches the pair: ``talon.server.offer``, the preset policy."""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr
import torch

from talon.engine.build import build_engine
from talon.engine.engine import Engine
from talon.models import ModelLoadError, gpu_health, resolve_device, zerogpu
from talon.models.embedded import EMBEDDED_MODELS
from talon.models.memory import DTYPE_BYTES, KNOWN_SHAPES, check_fits, trim_host_heap
from talon.run_config import ConfigError, RunConfig
from talon.server import offer
from talon.server.offer import find_preset, initial_preset, model_short_name, preset_estimate
from talon.server.presets import ModelPreset
from talon.settings import PairKey, Settings

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
    estimate = preset_estimate(settings, preset, dtype)
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


def held_status() -> str:
    """What every page's status line says about the models: loading (which, how large), held,
    or none; and the last switch of the held pair."""
    if (loading := SLOT.loading) is not None:
        now = f"Loading the models: {pair_words(loading)}. Runs start when they are ready."
    elif SLOT.held is not None:
        now = f"Models ready: {pair_words(SLOT.held.key)}."
    else:
        now = "No model pair is loaded yet; the first run loads it."
    return f"{now} {SLOT.switched}." if SLOT.switched else now


def device_notices() -> list[str]:
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


def load_startup_pair(settings: Settings) -> None:
    """Load the start-up pair now: from a background thread at start, or on ZeroGPU on the main
    thread before launch (ZeroGPU records the weights moved to cuda there). Errors are logged
    here and shown to the user on their first run."""
    try:
        load_engine(settings, find_preset(settings, initial_preset(settings)), guarded=not zerogpu.active())
    except (ModelLoadError, ConfigError, OSError, torch.cuda.OutOfMemoryError) as error:
        logger.error("could not pre-load the models: %s", error)
        release_memory()


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
    """Return freed tensors to the device: collect garbage, hand the host heap's free pages back to
    the system, then empty CUDA's caching allocator."""
    gc.collect()
    trim_host_heap()
    if offer.cuda_available():  # (the module's, so a test may stand a GPU in)
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
