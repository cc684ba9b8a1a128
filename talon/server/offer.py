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
  running work (the model runs share one queue slot).

This is the preset policy, apart from the pair held (``talon.server.pair``, the slot). It imports
no torch until a function asks the device, so the views that list presets stay torch-free."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from talon.knobs import DRAFTERS, HEAD_PAIR_KINDS, MODEL_PAIR_KINDS, MTP_COUNTERPART, MTP_KINDS, slot_kind
from talon.models import zerogpu
from talon.models.embedded import EMBEDDED_MODELS
from talon.models.head_config import read_head_config
from talon.models.memory import DTYPE_BYTES, GIB, KNOWN_SHAPES, MemoryEstimate, estimate_pair
from talon.models.mtp_config import declares_mtp
from talon.run_config import MAX_BUDGET, ConfigError
from talon.server.presets import DEFAULT_PRESET, PRESETS, ModelPreset, available_presets, startup_preset
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
    if zerogpu.active() or settings.device.startswith("cpu"):
        return None
    import torch  # (see cuda_available)

    if not torch.cuda.is_available():
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


def cuda_available() -> bool:
    import torch  # asked of the device when a preset list is made, not when the views import this

    return torch.cuda.is_available()


def _device_presets(settings: Settings) -> list[ModelPreset]:
    """The presets this device kind runs: the GPU pairs only with CUDA and TALON_DEVICE not cpu."""
    return available_presets(cuda_available() and not settings.device.startswith("cpu"))


def _refusals(settings: Settings) -> dict[str, str]:
    """Preset key -> why this server cannot run it (``talon.server.offer.refusal``)."""
    kinds = _device_presets(settings)
    total = gpu_total_bytes(settings) if any(p.needs_cuda for p in kinds) else None
    return {p.key: why for p in kinds if (why := refusal(settings, p, total)) is not None}


def presets(settings: Settings) -> list[ModelPreset]:
    """The presets this server offers: those its device holds, among the ones TALON_PRESETS names."""
    refused = _refusals(settings)
    return chosen(settings, [p for p in _device_presets(settings) if p.key not in refused])


def unoffered(settings: Settings) -> list[tuple[ModelPreset, str]]:
    """The presets TALON_PRESETS would offer that this server cannot run, with the reason."""
    refused = _refusals(settings)
    return [(p, refused[p.key]) for p in chosen(settings, _device_presets(settings)) if p.key in refused]


def visitor_presets(settings: Settings) -> list[ModelPreset]:
    """What a visitor may pick: every offered preset, or, where the owner picks the pair
    (TALON_PRESET_SWITCH=owner), the held one alone."""
    offered = presets(settings)
    if switch_policy(settings) == "owner":
        return [p for p in offered if p.key == initial_preset(settings)]
    return offered


def switch_policy(settings: Settings) -> str:
    return who_switches(settings, any(p.needs_cuda for p in _device_presets(settings)))


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


def target_has_mtp(settings: Settings, preset: ModelPreset) -> bool:
    """Does ``preset``'s target ship MTP layers (an MTP preset's, or the server's own pair with
    TALON_TARGET a directory whose config declares them, on attention-only layers)?"""
    return preset.mtp or (preset.target is None and bool(settings.target) and declares_mtp(settings.target))


def drafter_choices(settings: Settings, key: str, current: str = "") -> tuple[tuple[str, ...], str]:
    """The drafter kinds the app offers for preset ``key`` (a head's kinds where the draft slot
    holds one, a draft model's elsewhere; the MTP layer's first where the target ships one, and no
    draft model's where the slot is empty), and the choice to show: ``current`` where offered, else
    its counterpart (hybrid and eagle3-hybrid, model and eagle3; mtp-hybrid and mtp where the draft
    slot is empty), else the first."""
    preset = find_preset(settings, key)
    head = holds_head(settings, preset)
    offered = HEAD_PAIR_KINDS if head else MODEL_PAIR_KINDS
    if target_has_mtp(settings, preset):
        empty = (preset.draft or settings.draft or "none").strip().lower() in ("none", "")
        offered = (*MTP_KINDS, *(k for k in offered if not (empty and DRAFTERS[k].model == "draft")))
        if current not in offered or (empty and current in MTP_COUNTERPART):
            current = MTP_COUNTERPART.get(current, offered[0])
        return offered, current
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
