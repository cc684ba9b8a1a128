"""The run controls as the UI and the API send them (``Controls``), validated into a RunConfig,
plus the cheap prompt checks and ``user_error``: every problem a user can fix becomes a
gr.Error whose message is escaped (Gradio renders it as HTML)."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any

import gradio as gr

from talon import figures as F
from talon.prompt import PromptError
from talon.presets import DEFAULT_PRESET
from talon.run_config import (
    DRAFTING_KINDS,
    ConfigError,
    RetrievalConfig,
    RunConfig,
    SamplingConfig,
    TreeConfig,
)
from talon.settings import DRAFT_QUANTS, INT8_REFUSED, TARGET_WEIGHTS, Settings

UI_DRAFTERS = DRAFTING_KINDS


def _as_int(name: str, value: Any) -> int:
    """An integer from a UI/API value (sliders send floats); refuses 2.5, True, 'x'."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value != int(value)
    ):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    return int(value)


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Controls:
    """The values of the run controls, as the API and the UI send them (all have defaults, so an
    API call may pass the prompt alone)."""

    preset: str = DEFAULT_PRESET
    drafter: str = RunConfig.drafter
    tree_mode: str = TreeConfig.mode
    budget: float = TreeConfig.budget
    root_k: float = TreeConfig.root_k
    top_k: float = TreeConfig.top_k
    mu: float = TreeConfig.mu
    max_depth: float = TreeConfig.max_depth
    min_conf: float = TreeConfig.min_conf
    retrieval_threshold: float = RetrievalConfig.graft_threshold
    temperature: float = SamplingConfig.temperature
    top_p: float = SamplingConfig.top_p
    seed: float = SamplingConfig.seed
    max_new_tokens: float = RunConfig.max_new_tokens
    async_draft: bool = RunConfig.async_draft
    cost_aware: bool = TreeConfig.cost_aware
    draft_quant: str = "auto"
    target_weights: str = "auto"  # auto: TALON_TARGET_WEIGHTS

    @classmethod
    def from_config(cls, config: dict[str, Any], preset: str = DEFAULT_PRESET) -> Controls:
        """The controls that reproduce a run from its summary's ``config`` (a RunConfig as a
        dict: a trace's ``summary.config``); what it does not name keeps its default."""
        tree, retrieval, sampling = (config.get(key) or {} for key in ("tree", "retrieval", "sampling"))
        defaults = cls()
        return cls(
            preset=preset,
            drafter=config.get("drafter", defaults.drafter),
            tree_mode=tree.get("mode", defaults.tree_mode),
            budget=tree.get("budget", defaults.budget),
            root_k=tree.get("root_k", defaults.root_k),
            top_k=tree.get("top_k", defaults.top_k),
            mu=tree.get("mu", defaults.mu),
            max_depth=tree.get("max_depth", defaults.max_depth),
            min_conf=tree.get("min_conf", defaults.min_conf),
            retrieval_threshold=retrieval.get("graft_threshold", defaults.retrieval_threshold),
            temperature=sampling.get("temperature", defaults.temperature),
            top_p=sampling.get("top_p", defaults.top_p),
            seed=sampling.get("seed", defaults.seed),
            max_new_tokens=config.get("max_new_tokens", defaults.max_new_tokens),
            async_draft=config.get("async_draft", defaults.async_draft),
            cost_aware=tree.get("cost_aware", defaults.cost_aware),
        )

    def to_config(self, max_new_tokens_limit: int) -> RunConfig:
        """The validated RunConfig; raises ConfigError with a message a user can act on."""
        if self.draft_quant not in DRAFT_QUANTS:
            raise ConfigError(f"draft weights must be one of {DRAFT_QUANTS}, got {self.draft_quant!r}")
        if self.target_weights == "int8":
            raise ConfigError(INT8_REFUSED)
        if self.target_weights not in TARGET_WEIGHTS:
            raise ConfigError(f"target weights must be one of {TARGET_WEIGHTS}, got {self.target_weights!r}")
        if self.drafter not in UI_DRAFTERS:
            raise ConfigError(f"drafter must be one of {UI_DRAFTERS}, got {self.drafter!r}")
        max_new = _as_int("max_new_tokens", self.max_new_tokens)
        if max_new > max_new_tokens_limit:
            raise ConfigError(f"max_new_tokens must be at most {max_new_tokens_limit} on this server, got {max_new}")
        tree = TreeConfig(
            mode=str(self.tree_mode),  # type: ignore[arg-type]
            budget=_as_int("budget", self.budget),
            root_k=_as_int("root_k", self.root_k),
            top_k=_as_int("top_k", self.top_k),
            mu=_as_float("mu", self.mu),
            max_depth=_as_int("max_depth", self.max_depth),
            min_conf=_as_float("min_conf", self.min_conf),
            cost_aware=self.cost_aware is True,
        )
        sampling = SamplingConfig(
            temperature=_as_float("temperature", self.temperature),
            top_p=_as_float("top_p", self.top_p),
            seed=_as_int("seed", self.seed),
        )
        retrieval = RetrievalConfig(graft_threshold=_as_int("retrieval_threshold", self.retrieval_threshold))
        return RunConfig(
            drafter=self.drafter,  # type: ignore[arg-type]
            tree=tree,
            retrieval=retrieval,
            sampling=sampling,
            max_new_tokens=max_new,
            async_draft=bool(self.async_draft),
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
