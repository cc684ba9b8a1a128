"""The Serve tab: the current controls as the nearest SGLang launch flags and vLLM
``--speculative-config``, with what does not carry over (``talon.serving``). Also the
``/serving_config`` API endpoint, which takes the same controls as ``/generate``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradio as gr

from talon.models.loading import NO_DRAFT
from talon.run_config import ConfigError
from talon.serving import serving_config
from talon.settings import Settings
from talon.ui.backend import find_preset
from talon.ui.controls import Controls, user_error
from talon.ui.panel import ControlPanel
from talon.ui.words import EXPLAIN


def make_serving_config(settings: Settings) -> Callable[..., tuple[str, dict[str, Any]]]:
    def translate(**controls: Any) -> tuple[str, dict[str, Any]]:
        """The controls as server flags: markdown for the panel, the same as JSON for the API."""
        values = Controls(**controls)
        try:
            cfg = values.to_config(settings.max_new_tokens_limit)
            preset = find_preset(settings, values.preset)
        except ConfigError as error:
            raise user_error(str(error)) from error
        target = preset.target or settings.target
        draft = preset.draft or settings.draft
        result = serving_config(cfg, target, None if draft is None or draft.strip().lower() in NO_DRAFT else draft)
        return result.markdown(), result.to_dict()

    return translate


def build_serving_tab(panel: ControlPanel, settings: Settings) -> None:
    """The Serve it tab, built and wired (call inside the tab)."""
    gr.Markdown(EXPLAIN["serve"], elem_classes=["talon-explain"])
    go_button = gr.Button("Translate the current controls", variant="primary", elem_id="talon-serve-run")
    flags = gr.Markdown("Press the button: the controls on the left become server flags.", elem_id="talon-serve")
    as_json = gr.JSON(label="The same, as JSON (what the /serving_config API returns)", visible=True)
    go_button.click(make_serving_config(settings), inputs_kwargs=dict(panel.components), outputs=[flags, as_json],
                    api_name="serving_config", concurrency_limit=None, show_progress="hidden")
