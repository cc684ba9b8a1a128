"""The one door from the views into the server: every run a user starts, the presets the server
offers, the controls a request carries and the errors a user can act on. A view imports this
module and nothing else of the server, and nothing of the engine, the models or torch
(``tests/test_layers.py`` holds both). This module imports no torch either: what runs a model
(``talon.server.device``, the slot ``talon.server.pair``) is imported by the call that needs it,
so ``import talon.ui`` leaves torch unloaded until the first run or the start-up load.

A Decode press goes ``talon.ui.decode_handlers`` -> ``decode_all`` (its runs validated now: every
error a user can fix is raised before any output changes) -> iterating a run's steps runs the
action's one device call (``talon.server.device.decode_on_device``) -> ``Engine.run`` -> the
step loop."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from talon.atlas.data import Atlas
from talon.models import zerogpu
from talon.run_config import RunConfig
from talon.server.controls import Controls, RunRequest, user_error
from talon.server.examples import Example, load_examples
from talon.server.offer import (
    drafter_choices,
    find_preset,
    initial_preset,
    preset_label,
    presets,
    switch_policy,
    unoffered,
    visitor_presets,
)
from talon.server.presets import ModelPreset
from talon.settings import NO_DRAFT, Settings

if TYPE_CHECKING:
    from talon.server.device import ActionRun, DeviceAction


__all__ = [
    "NO_DRAFT", "Controls", "Example", "ModelPreset", "RunRequest", "decode", "decode_all", "drafter_choices",
    "find_preset", "initial_preset", "load_examples", "pair_status", "preset_label", "presets", "record_prompt_atlas",
    "server_notices", "start_status", "switch_policy", "unoffered", "user_error", "visitor_presets", "wait_for_pair",
    "warm_up",
]


def decode_all(settings: Settings, requests: list[RunRequest], cancel: threading.Event) -> DeviceAction:
    """Several runs of one user action (a decode and its baseline, Compare's A and B, a sweep's
    cells), validated now and run in turn in one device call: ``.runs[i]`` iterates run i's
    StepTraces and has its ``.summary`` when it ends."""
    from talon.server.device import DeviceAction

    return DeviceAction(settings, requests, cancel)


def decode(settings: Settings, prompt: str, controls: Controls, cancel: threading.Event,
           **overrides: Any) -> ActionRun:
    """One run, validated now: iterate it for StepTraces; ``.summary`` when it ends."""
    return decode_all(settings, [RunRequest(prompt, controls, overrides)], cancel).runs[0]


def record_prompt_atlas(settings: Settings, preset: ModelPreset, prompt: str,
                        cfg: RunConfig) -> Iterator[tuple[float, str] | Atlas]:
    """Record ``prompt``'s draft atlas in a device call of its own: yields (fraction done, what is
    happening), then the Atlas. Validate first with ``decode`` (its ``preset`` and ``cfg``)."""
    from talon.server import device
    from talon.server.request import Job

    device.check_reservation(settings, [Job(preset, prompt, cfg)], device.record_seconds(settings, preset, prompt, cfg),
                             per_token=2)
    return device.record_on_device(settings, preset, prompt, cfg)  # looked up now: ZeroGPU's wrapper replaces it


def start_status(action: DeviceAction) -> str:
    """The status line while an action starts: on ZeroGPU it first waits for a GPU slot."""
    return zerogpu.waiting_note(action.gpu_seconds) if zerogpu.active() else "running…"


def wait_for_pair(settings: Settings, preset_key: str, cancel: threading.Event) -> Iterator[str]:
    """Status lines while the preset's pair loads (``talon.server.device.wait_for_pair``)."""
    from talon.server.device import pair_wait

    return pair_wait(settings, preset_key, cancel)


def pair_status() -> str:
    """What every page's status line says about the models (``talon.server.pair.held_status``)."""
    from talon.server.pair import held_status

    return held_status()


def server_notices() -> list[str]:
    """What every visitor should know about this server before a run (``talon.server.pair.device_notices``)."""
    from talon.server.pair import device_notices

    return device_notices()


def warm_up(settings: Settings) -> None:
    """Load the start-up pair now (``talon.server.pair.load_startup_pair``)."""
    from talon.server.pair import load_startup_pair

    load_startup_pair(settings)
