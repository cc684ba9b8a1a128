"""The run controls as the UI and the API send them (``Controls``), validated into a RunConfig,
plus the cheap prompt checks and ``user_error``: every problem a user can fix becomes a
gr.Error whose message is escaped (Gradio renders it as HTML)."""

from __future__ import annotations

import dataclasses
import html
from typing import Any

import gradio as gr

from talon import figures as F
from talon.prompt import PromptError
from talon.presets import DEFAULT_PRESET
from talon.knobs import APP_KNOBS, KNOB, values_of
from talon.run_config import ConfigError, RunConfig
from talon.settings import DRAFT_QUANTS, INT8_REFUSED, TARGET_WEIGHTS, Settings

UI_DRAFTERS = KNOB["drafter"].app_choices


def _from_config(cls: type, config: dict[str, Any], preset: str = DEFAULT_PRESET) -> Any:
    """The controls that reproduce a run from its summary's ``config`` (a RunConfig as a dict: a
    trace's ``summary.config``); what it does not name keeps its default."""
    values = values_of(config)
    return cls(preset=preset, **{k.app: values[k.name] for k in APP_KNOBS})


def _to_config(self: Any, max_new_tokens_limit: int) -> RunConfig:
    """The validated RunConfig; raises ConfigError with a message a user can act on."""
    if self.draft_quant not in DRAFT_QUANTS:
        raise ConfigError(f"draft weights must be one of {DRAFT_QUANTS}, got {self.draft_quant!r}")
    if self.target_weights == "int8":
        raise ConfigError(INT8_REFUSED)
    if self.target_weights not in TARGET_WEIGHTS:
        raise ConfigError(f"target weights must be one of {TARGET_WEIGHTS}, got {self.target_weights!r}")
    values = {k.name: getattr(self, k.app) for k in APP_KNOBS}
    return RunConfig().with_knobs(values, app=True, caps={"max_new_tokens": max_new_tokens_limit})


# The run controls as the API and the UI send them: the model pair and weights, then every knob
# the app offers under its public name (talon.knobs: ``Knob.app``). All have defaults, so an API
# call may pass the prompt alone.
Controls = dataclasses.make_dataclass(
    "Controls",
    [("preset", str, DEFAULT_PRESET), *((k.app, Any, k.default) for k in APP_KNOBS),
     ("draft_quant", str, "auto"), ("target_weights", str, "auto")],  # auto: the server's (TALON_*)
    frozen=True,
    namespace={"__doc__": "The values of the run controls, as the API and the UI send them.",
               "from_config": classmethod(_from_config), "to_config": _to_config},
)


def check_prompt(prompt: Any, settings: Settings) -> str:
    """Cheap checks before any model work (the engine checks the token count)."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise PromptError("the prompt is empty: type some text, or pick an example")
    max_chars = 16 * settings.max_prompt_tokens
    if len(prompt) > max_chars:
        raise PromptError(f"the prompt has {len(prompt)} characters; this server accepts at most {max_chars}")
    return prompt


def user_error(message: str) -> gr.Error:
    """A gr.Error whose message may quote user input: Gradio renders error messages as HTML."""
    return gr.Error(html.escape(F.clean_text(message), quote=False))
