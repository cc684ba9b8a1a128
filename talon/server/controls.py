"""What a user sends: the run controls (``Controls``, every knob the app offers under its public
name), one run's request (``RunRequest``: a prompt, its controls, the RunConfig fields a view
overrides), and the error a user sees (``user_error``). Plain values, no torch: the views build
them, and the server (``talon.server.request``) validates them into jobs."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from talon.figures.text import clean_text
from talon.knobs import APP_KNOBS, KNOB, values_of
from talon.run_config import ConfigError, RunConfig
from talon.server.presets import DEFAULT_PRESET
from talon.settings import DRAFT_QUANTS, INT8_REFUSED, TARGET_WEIGHTS

Number = int | float  # a slider sends a float for an integer knob (talon.knobs.Knob.read)


@dataclass(frozen=True)
class Controls:
    """The values of the run controls, as the API and the UI send them: the model pair, then every
    knob the app offers under its public name (``talon.knobs``: ``Knob.app``, its default there;
    ``tests/test_knobs.py`` holds these fields equal to the app's knobs), then the weights. All have
    defaults, so an API call may pass the prompt alone."""

    preset: str = DEFAULT_PRESET
    drafter: str = KNOB["drafter"].default
    tree_mode: str = KNOB["tree"].default
    budget: Number = KNOB["budget"].default
    root_k: Number = KNOB["root_k"].default
    top_k: Number = KNOB["top_k"].default
    mu: Number = KNOB["mu"].default
    max_depth: Number = KNOB["max_depth"].default
    min_conf: Number = KNOB["min_conf"].default
    cost_aware: bool = KNOB["cost_aware"].default
    retrieval_threshold: Number = KNOB["graft_threshold"].default
    skip_layers: Number = KNOB["skip_layers"].default
    temperature: Number = KNOB["temperature"].default
    top_p: Number = KNOB["top_p"].default
    seed: Number = KNOB["seed"].default
    max_new_tokens: Number = KNOB["max_new_tokens"].default
    async_draft: bool = KNOB["async_draft"].default
    draft_quant: str = "auto"  # auto: the server's (TALON_DRAFT_QUANT)
    target_weights: str = "auto"  # auto: the server's (TALON_TARGET_WEIGHTS)

    @classmethod
    def from_config(cls, config: dict[str, Any], preset: str = DEFAULT_PRESET) -> Controls:
        """The controls that reproduce a run from its summary's ``config`` (a RunConfig as a dict: a
        trace's ``summary.config``); what it does not name keeps its default."""
        values = values_of(config)
        return cls(preset=preset, **{k.app: values[k.name] for k in APP_KNOBS})

    def to_config(self, max_new_tokens_limit: int) -> RunConfig:
        """The validated RunConfig; raises ConfigError with a message a user can act on."""
        if self.draft_quant not in DRAFT_QUANTS:
            raise ConfigError(f"draft weights must be one of {DRAFT_QUANTS}, got {self.draft_quant!r}")
        if self.target_weights == "int8":
            raise ConfigError(INT8_REFUSED)
        if self.target_weights not in TARGET_WEIGHTS:
            raise ConfigError(f"target weights must be one of {TARGET_WEIGHTS}, got {self.target_weights!r}")
        values = {k.name: getattr(self, k.app) for k in APP_KNOBS}
        return RunConfig().with_knobs(values, app=True, caps={"max_new_tokens": max_new_tokens_limit})


@dataclass(frozen=True)
class RunRequest:
    """One run of a user action, as a view asks for it: validated into a ``Job`` by the server."""

    prompt: str
    controls: Controls
    overrides: dict[str, Any] = field(default_factory=dict)  # RunConfig fields (e.g. the baseline's drafter)


def user_error(message: str) -> gr.Error:
    """A gr.Error whose message may quote user input: Gradio renders error messages as HTML."""
    return gr.Error(html.escape(clean_text(message), quote=False))
