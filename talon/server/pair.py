"""The model pair this server holds, and the presets it offers: which pair a preset loads
(``pair_key``), the memory guard (``check_preset_memory``), the one pair held (``SLOT``, a
``PairSlot``: release before load, fall back on failure), the start-up load
(``warm_up``), and out-of-memory turned into an error a user can act on, with the memory freed."""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import torch

from talon.engine.build import PairKey, build_engine
from talon.engine.engine import Engine
from talon.knobs import HEAD_PAIR_KINDS, MODEL_PAIR_KINDS
from talon.models import ModelLoadError, gpu_health, resolve_device, zerogpu
from talon.models.eagle3 import read_head_config
from talon.models.memory import DTYPE_BYTES, KNOWN_SHAPES, check_fits, estimate_pair
from talon.run_config import MAX_BUDGET, ConfigError, RunConfig
from talon.server.presets import ModelPreset, available_presets, startup_preset
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
        self.drop()
        if guard is not None:
            guard(self._free_bytes(key.device))
        try:
            engine = self._build(key)
        except RuntimeError as error:
            if not is_out_of_memory(error):
                raise
            self._release()
            raise ModelLoadError(f"{key.describe()} did not fit in the device's memory while loading "
                                 f"({error}).") from None
        self.held = Held(key, engine)
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
    this server's largest settings (longest prompt + most new tokens + the largest tree)."""
    target, draft = KNOWN_SHAPES.get(preset.target or ""), KNOWN_SHAPES.get(preset.draft or "")
    if target is None:
        return  # not a pair whose shape is known without a download
    tokens = settings.max_prompt_tokens + settings.max_new_tokens_limit + MAX_BUDGET + 1
    # a guarded device is a CUDA one, where steps replay as graphs (talon.graphs.static.resolve_forward)
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


def held_key() -> PairKey | None:
    return SLOT.held.key if SLOT.held is not None else None


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


def presets(settings: Settings) -> list[ModelPreset]:
    """The presets this server offers: the GPU pairs only with CUDA and TALON_DEVICE not cpu."""
    return available_presets(cuda_available() and not settings.device.startswith("cpu"))


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
    """The preset selected (and loaded) at start; see ``talon.server.presets.startup_preset``."""
    gpu = any(p.needs_cuda for p in presets(settings))
    return startup_preset(gpu, (settings.target, settings.draft) != (EMBEDDED_TARGET, EMBEDDED_DRAFT))


# a drafter kind's counterpart when the pair's draft slot holds an EAGLE-3 head instead of a draft model
HEAD_COUNTERPART = {"hybrid": "eagle3-hybrid", "model": "eagle3"}


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
    if current in offered:
        return offered, current
    swap = HEAD_COUNTERPART if head else {v: k for k, v in HEAD_COUNTERPART.items()}
    return offered, swap.get(current, offered[0])


def find_preset(settings: Settings, key: str) -> ModelPreset:
    offered = presets(settings)
    for preset in offered:
        if preset.key == key:
            return preset
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
