"""The one door from the views into the server: every run a user starts, the presets the server
offers, the controls a request carries and the errors a user can act on. A view imports this
module and nothing else of the server, and nothing of the engine, the models or torch
(``tests/test_layers.py`` holds both).

A Decode press goes ``talon.ui.decode_tab`` -> ``decode_all`` (its runs validated now: every
error a user can fix is raised before any output changes) -> iterating a run's steps runs the
action's one device call (``talon.server.device.decode_on_device``) -> ``Engine.run`` -> the
step loop."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from talon.atlas.data import Atlas
from talon.models.loading import NO_DRAFT
from talon.run_config import RunConfig
from talon.server import device
from talon.server.device import ActionRun, DeviceAction, start_status, wait_for_pair
from talon.server.examples import Example, load_examples
from talon.server.pair import (
    drafter_choices,
    find_preset,
    initial_preset,
    pair_status,
    preset_label,
    presets,
    server_notices,
    switch_policy,
    unoffered,
    visitor_presets,
    warm_up,
)
from talon.server.presets import ModelPreset
from talon.server.request import Controls, Job, user_error
from talon.settings import Settings

__all__ = [
    "NO_DRAFT", "ActionRun", "Controls", "DeviceAction", "Example", "ModelPreset", "decode", "decode_all",
    "drafter_choices", "find_preset", "initial_preset", "load_examples", "pair_status", "preset_label", "presets",
    "record_prompt_atlas", "server_notices", "start_status", "switch_policy", "unoffered", "user_error",
    "visitor_presets", "wait_for_pair", "warm_up",
]


def decode_all(settings: Settings, requests: list[tuple[str, Controls, dict[str, Any]]],
               cancel: threading.Event) -> DeviceAction:
    """Several runs of one user action (a decode and its baseline, Compare's A and B, a sweep's
    cells), validated now and run in turn in one device call: ``.runs[i]`` iterates run i's
    StepTraces and has its ``.summary`` when it ends. ``requests``: (prompt, controls, RunConfig
    fields to override) a run."""
    return DeviceAction(settings, requests, cancel)


def decode(settings: Settings, prompt: str, controls: Controls, cancel: threading.Event,
           **overrides: Any) -> ActionRun:
    """One run, validated now: iterate it for StepTraces; ``.summary`` when it ends."""
    return decode_all(settings, [(prompt, controls, overrides)], cancel).runs[0]


def record_prompt_atlas(settings: Settings, preset: ModelPreset, prompt: str,
                        cfg: RunConfig) -> Iterator[tuple[float, str] | Atlas]:
    """Record ``prompt``'s draft atlas in a device call of its own: yields (fraction done, what is
    happening), then the Atlas. Validate first with ``decode`` (its ``preset`` and ``cfg``)."""
    device.check_reservation(settings, [Job(preset, prompt, cfg)], device.record_seconds(settings, preset, prompt, cfg),
                             per_token=2)
    return device.record_on_device(settings, preset, prompt, cfg)  # looked up now: ZeroGPU's wrapper replaces it
