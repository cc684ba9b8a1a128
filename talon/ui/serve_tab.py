"""The Serve tab: the current controls as the nearest SGLang launch flags, llama-server flags and vLLM
``--speculative-config``, with what does not carry over (``talon.atlas.serving``), and what the engines
would accept with them on the current prompt's atlas, beside Talon's own, with each engine's best
settings there (``talon.atlas.forecast``). Also the ``/serving_config`` API endpoint, which takes
the same controls as ``/generate``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradio as gr

from talon.atlas.explorer import AtlasSession
from talon.atlas.forecast import forecast
from talon.atlas.serving import serving_config
from talon.run_config import ConfigError
from talon.server.facade import NO_DRAFT, Controls, find_preset, user_error
from talon.settings import Settings
from talon.ui.panel import ControlPanel
from talon.ui.session import bounded
from talon.ui.words import EXPLAIN


def make_serving_config(settings: Settings) -> Callable[..., tuple[str, dict[str, Any], str]]:
    @bounded("forecasting the engines")
    def translate(atlas_state: AtlasSession | None = None, **controls: Any) -> tuple[str, dict[str, Any], str]:
        """The controls as server flags: markdown for the panel, the same as JSON for the API, and
        the engines' forecast on the explorer's atlas (this session's, if any)."""
        values = Controls(**controls)
        try:
            cfg = values.to_config(settings.max_new_tokens_limit)
            preset = find_preset(settings, values.preset)
        except ConfigError as error:
            raise user_error(str(error)) from error
        target = preset.target or settings.target
        draft = preset.draft or settings.draft
        result = serving_config(cfg, target, None if draft is None or draft.strip().lower() in NO_DRAFT else draft)
        atlas = atlas_state.atlas if isinstance(atlas_state, AtlasSession) else None
        return result.markdown(), result.to_dict(), forecast(atlas, cfg, result).markdown()

    return translate


def build_serve_tab(panel: ControlPanel, settings: Settings, atlas_state: gr.State) -> None:
    """The Serve it tab, built and wired (call inside the tab); ``atlas_state``: the explorer's."""
    gr.Markdown(EXPLAIN["serve"], elem_classes=["talon-explain"])
    go_button = gr.Button("Translate the current controls", variant="primary", elem_id="talon-serve-run")
    predicted = gr.Markdown("", elem_id="talon-serve-forecast")
    flags = gr.Markdown("Press the button: the controls on the left become server flags.", elem_id="talon-serve")
    as_json = gr.JSON(label="The same, as JSON (what the /serving_config API returns)", visible=True)
    go_button.click(make_serving_config(settings), inputs_kwargs={**panel.components, "atlas_state": atlas_state},
                    outputs=[flags, as_json, predicted], api_visibility="private", concurrency_limit=None,
                    show_progress="hidden")
    # the API's: no session state, so the plain HTTP route takes exactly the controls (talon.ui.layout)
    gr.Button(visible=False).click(make_serving_config(settings), inputs_kwargs=panel.components,
                                   outputs=[flags, as_json, predicted], api_name="serving_config",
                                   concurrency_limit=None, show_progress="hidden")
