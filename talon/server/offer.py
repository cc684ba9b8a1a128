"""Which model presets this server offers, and who may switch the pair it holds.

* **What fits.** A GPU preset is offered only where its memory need (the memory guard's
  estimate at this server's largest settings, ``preset_need_bytes``) fits the GPU's total
  memory; the default pair only where its models can load (the embedded pair's parts installed).
  The others are listed with the reason (``unoffered``), never offered and then refused.
* **What the owner offers.** ``TALON_PRESETS`` lists the preset keys a Space offers; unset, a GPU
  Space offers the presets it preloads (README ``preload_from_hub``), so no visitor's pick
  downloads a pair inside a run; ``all`` offers every preset that fits.
* **Who switches.** ``TALON_PRESET_SWITCH=owner`` (the default on a GPU): visitors run the held
  pair, which ``TALON_PRESET`` picks, and a request for another is refused with the reason, so no
  visitor evicts another's pair. ``visitors``: a visitor's pick loads for everyone, after the
  running work (the model runs share one queue slot)."""

from __future__ import annotations

import importlib.util

import torch

from talon.models import zerogpu
from talon.models.embedded import EMBEDDED_MODELS
from talon.models.memory import DTYPE_BYTES, GIB, KNOWN_SHAPES, MemoryEstimate, estimate_pair
from talon.run_config import MAX_BUDGET, ConfigError
from talon.server.presets import DEFAULT_PRESET, PRESETS, ModelPreset
from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET, Settings


def preset_estimate(settings: Settings, preset: ModelPreset, dtype: str) -> MemoryEstimate | None:
    """The memory guard's estimate for ``preset`` at this server's largest settings (longest
    prompt + most new tokens + the largest tree; a guarded device is a CUDA one, where steps replay
    as graphs); None where the shapes are not known without a download."""
    target, draft = KNOWN_SHAPES.get(preset.target or ""), KNOWN_SHAPES.get(preset.draft or "")
    if target is None:
        return None
    tokens = settings.max_prompt_tokens + settings.max_new_tokens_limit + MAX_BUDGET + 1
    return estimate_pair(target, draft, dtype if dtype in DTYPE_BYTES else "bfloat16", tokens, graphs=True)


def preset_need_bytes(settings: Settings, preset: ModelPreset, dtype: str) -> int | None:
    """The bytes ``preset_estimate`` says the pair needs (what the Models menu holds a GPU to)."""
    estimate = preset_estimate(settings, preset, dtype)
    return None if estimate is None else estimate.total


def gpu_total_bytes(settings: Settings) -> int | None:
    """The memory of the GPU the pairs load on (all visible GPUs for ``auto``/``cuda``, where the
    target spreads over them); None on a CPU and on ZeroGPU (no device may be asked at start)."""
    if zerogpu.active() or settings.device.startswith("cpu") or not torch.cuda.is_available():
        return None
    name = settings.device.strip().lower()
    indices = [int(name.split(":")[1])] if ":" in name else range(torch.cuda.device_count())
    return sum(torch.cuda.get_device_properties(i).total_memory for i in indices)


def embedded_installed(settings: Settings) -> bool:
    """Are the embedded pair's part packages installed (requirements-embedded.txt)?"""
    models = [EMBEDDED_MODELS[m] for m in (settings.target, settings.draft) if m in EMBEDDED_MODELS]
    return all(importlib.util.find_spec(p.replace("-", "_")) is not None for m in models for p in m.packages)


def refusal(settings: Settings, preset: ModelPreset, total: int | None) -> str | None:
    """Why this server cannot run ``preset`` (None: it can). ``total``: the GPU's memory."""
    if preset.needs_cuda and total is not None:
        need = preset_need_bytes(settings, preset, settings.dtype if settings.dtype != "auto" else preset.dtype or "")
        if need is not None and need > total:
            return f"needs about {need / GIB:.0f} GiB of GPU memory; this GPU has {total / GIB:.0f} GiB"
    if preset.key == DEFAULT_PRESET and not embedded_installed(settings):
        return "the embedded pair's parts are not installed here (pip install -r requirements-embedded.txt)"
    return None


def chosen(settings: Settings, runnable: list[ModelPreset]) -> list[ModelPreset]:
    """The presets among ``runnable`` that TALON_PRESETS offers (its default: see the module)."""
    if settings.presets == "all":
        return runnable
    if settings.presets:
        keys = {k.strip() for k in settings.presets.split(",") if k.strip()}
        unknown = keys - {p.key for p in PRESETS}
        if unknown:
            raise ConfigError(f"TALON_PRESETS names no preset {sorted(unknown)}; the presets: "
                              f"{[p.key for p in PRESETS]}")
        return [p for p in runnable if p.key in keys]
    own = (settings.target, settings.draft) != (EMBEDDED_TARGET, EMBEDDED_DRAFT)  # the owner's TALON_TARGET pair
    gpu = [p for p in runnable if p.preload or (own and p.key == DEFAULT_PRESET)]
    return gpu if any(p.needs_cuda for p in gpu) else runnable  # a GPU offers what it preloads; a CPU its pairs


def who_switches(settings: Settings, gpu: bool) -> str:
    """owner or visitors (``auto``: owner where GPU presets are offered)."""
    if settings.preset_switch != "auto":
        return settings.preset_switch
    return "owner" if gpu else "visitors"
