"""The recordings shipped with the app (``static/recording.json``, the first view, and
``static/recording_sampled.json``, a sampled run): loaded once, with what the page says about
them and the controls that made them."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gradio as gr

from talon.figures.opening import RECORDING
from talon.server.facade import Controls
from talon.trace import RunSummary, StepTrace, TraceFileError, parse_trace, read_json_upload

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=2)
def load_recording(path: Path = RECORDING) -> tuple[RunSummary, tuple[StepTrace, ...]] | None:
    """The shipped trace shown before any model runs (parsed once; None if absent or bad)."""
    try:
        summary, steps = parse_trace(read_json_upload(path))
    except (TraceFileError, OSError) as error:
        logger.warning("no first view: cannot read %s: %s", path, error)
        return None
    return summary, tuple(steps)


SAMPLED_NOTE = ("RECORDING, SAMPLED: a run of the default pair at temperature 0.8 (seed 0), shipped with the app. "
                "It opens on a step where the target turned a draft down by chance and drew its own token from "
                "what was left: the figure under the node inspector draws the rule.")


RECORDING_NOTE = ("RECORDING: a run of the default pair on a 2-core CPU, shipped with the app so you can explore "
                  "before a model loads; it opens on its most instructive step. The prompt box and the controls are "
                  "set as it was made: press Run to decode it live (trees may differ on other hardware).")


def recording_controls(prompt: gr.Textbox, components: dict[str, Any],
                       path: Path = RECORDING) -> Callable[[], dict[Any, Any]]:
    def set_controls() -> dict[Any, Any]:
        """At page load: the prompt and controls that made the recording (nothing if absent)."""
        recording = load_recording(path)
        if recording is None or not recording[0].prompt:
            return {}
        summary = recording[0]
        values = Controls.from_config(summary.config)
        updates: dict[Any, Any] = {prompt: summary.prompt}
        for key, component in components.items():
            if key not in ("preset", "draft_quant", "target_weights"):  # the server's pair and weights stay
                updates[component] = getattr(values, key)
        return updates

    return set_controls
