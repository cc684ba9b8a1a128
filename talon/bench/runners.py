"""The methods: one runner per method (Talon's engine, or Hugging Face ``generate`` with an
assistant model or prompt lookup), all on the same models and chat-templated prompt ids."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from talon.bench.options import (
    ASSISTANT_PRESETS,
    DRAFT_MODEL_METHODS,
    EQUAL_BUDGET,
    BenchConfig,
    RunnerKind,
    SweepCell,
    SweepConfig,
)
from talon.engine.engine import Engine
from talon.engine.engine import generate as talon_generate
from talon.engine.prompt import eos_ids
from talon.knobs import KNOBS
from talon.models import LoadedModel
from talon.run_config import ConfigError, RunConfig, TreeConfig


@dataclass(frozen=True)
class MethodSpec:
    """What ran. ``name`` is unique per variant; ``method`` names the results row.

    best_of: one of several variants of ``method``; the fastest per suite is reported.
    cell: the sweep cell, for sweep runs.
    """

    name: str
    method: str
    engine: RunnerKind
    settings: dict[str, Any]
    best_of: bool = False
    cell: SweepCell | None = None


@dataclass(frozen=True)
class Outcome:
    """One method on one prompt. ``forwards``: target forwards (Talon: verification steps)."""

    token_ids: list[int]
    seconds: float
    forwards: int | None
    draft_s: float | None = None
    verify_s: float | None = None
    other_s: float | None = None
    accept_lens: list[int] | None = None  # Talon: accepted draft tokens per step
    draft_sizes: list[int] | None = None  # Talon: drafted nodes per step


class Runner(Protocol):
    spec: MethodSpec

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> Outcome: ...


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class TalonRunner:
    spec: MethodSpec
    engine: Engine
    cfg: RunConfig

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> Outcome:
        cfg = self.cfg.replace(max_new_tokens=max_new_tokens)
        start = time.perf_counter()
        summary, steps = talon_generate(self.engine, prompt_ids, cfg)
        seconds = time.perf_counter() - start
        return Outcome(
            summary.token_ids, seconds, summary.steps, summary.draft_s, summary.verify_s, summary.other_s,
            accept_lens=[st.accept_len for st in steps], draft_sizes=[len(st.tokens) - 1 for st in steps],
        )


@dataclass
class ForwardCount:
    n: int = 0


@contextlib.contextmanager
def count_forwards(model: torch.nn.Module) -> Iterator[ForwardCount]:
    """Count ``model``'s forward calls (a public forward hook) inside the block."""
    count = ForwardCount()

    def hook(module: torch.nn.Module, args: tuple, output: object) -> None:
        count.n += 1

    handle = model.register_forward_hook(hook)
    try:
        yield count
    finally:
        handle.remove()


@contextlib.contextmanager
def assistant_settings(assistant: LoadedModel | None, overrides: dict[str, Any]) -> Iterator[None]:
    """Set ``overrides`` on the assistant's generation_config for the block, then restore it."""
    if assistant is None or not overrides:
        yield
        return
    model = assistant.model
    saved = copy.deepcopy(model.generation_config)
    for key, value in overrides.items():
        setattr(model.generation_config, key, value)
    try:
        yield
    finally:
        model.generation_config = saved


@dataclass
class HfRunner:
    """transformers' ``generate`` (greedy): plain (``hf-greedy``, the independent reference),
    with assisted generation or with prompt lookup."""

    spec: MethodSpec
    target: LoadedModel
    assistant: LoadedModel | None
    generate_kwargs: dict[str, Any]
    assistant_overrides: dict[str, Any] = field(default_factory=dict)

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> Outcome:
        model = self.target.model
        ids = torch.tensor([prompt_ids], device=model.device)  # (1, P)
        with assistant_settings(self.assistant, self.assistant_overrides), count_forwards(model) as calls:
            start = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    **self.generate_kwargs,
                )  # (1, P + new)
            _sync(model.device)
            seconds = time.perf_counter() - start
        return Outcome(out[0, len(prompt_ids) :].tolist(), seconds, calls.n)


def talon_run_config(method: str, talon_async: bool, cost_model: str = "fixed") -> RunConfig:
    """The RunConfig of a Talon-engine method; ``talon`` is the full default RunConfig().

    chain, static and adaptive are the pure tree baselines at equal budget and depth (N = 24,
    min_conf 0, no cost-aware planning), so their MAT compares the tree shapes alone: static is
    EAGLE-2's shape ranked, like adaptive, by calibrated acceptance (``TreeConfig.admission``;
    ``--talon-variant admission=confidence`` ranks by raw path confidence); hybrid is the default
    configuration without cost-aware planning (pure TALON budget fill)."""
    pure = {"budget": EQUAL_BUDGET, "min_conf": 0.0, "cost_aware": False}
    configs = {
        "ar": RunConfig(drafter="none"),
        "chain": RunConfig(drafter="model", tree=TreeConfig(mode="chain", **pure)),
        "static": RunConfig(drafter="model", tree=TreeConfig(mode="static", **pure)),
        "adaptive": RunConfig(drafter="model", tree=TreeConfig(mode="adaptive", **pure)),
        "hybrid": RunConfig(drafter="hybrid", tree=TreeConfig(mode="adaptive", cost_aware=False)),
        "layerskip": RunConfig(drafter="layerskip"),  # the target drafts for itself: no draft model
        "talon": RunConfig(async_draft=talon_async),
    }
    return configs[method].replace(cost_model=cost_model)


VARIANT_KEYS: tuple[str, ...] = tuple(k.name for k in KNOBS if k.section in ("tree", "retrieval") and k.kind != "path"
                                  and k.name != "tree")


def talon_variant(base: RunConfig, text: str) -> RunConfig:
    """``base`` with ``key=value[,key=value]`` changes of its tree or retrieval knobs (named as
    the knob table names them: ``top_k=3``, ``mu=0.3,budget=24``, ``graft_threshold=2``);
    ConfigError if a key or value is bad."""
    changes: dict[str, str] = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in VARIANT_KEYS:
            raise ConfigError(f"talon variant {text!r}: expected key=value with a key among {', '.join(VARIANT_KEYS)}")
        changes[key] = value.strip()
    if not changes:
        raise ConfigError(f"talon variant {text!r} changes nothing")
    try:
        return base.with_knobs(changes)
    except ConfigError as error:
        raise ConfigError(f"talon variant {text!r}: {error}") from None


def variant_runners(engine: Engine, cfg: BenchConfig) -> list[Runner]:
    """One ``talon[...]`` row per ``--talon-variant``: the default configuration with a knob or two
    changed, timed in the same run as ``talon`` itself (a one-knob-at-a-time sweep)."""
    runners: list[Runner] = []
    for text in cfg.talon_variants:
        run_cfg = talon_variant(talon_run_config("talon", cfg.talon_async, cfg.cost_model), text)
        name = f"talon[{text.replace(' ', '')}]"
        runners.append(TalonRunner(MethodSpec(name, name, "talon", talon_settings(run_cfg)), engine, run_cfg))
    return runners


def talon_settings(cfg: RunConfig) -> dict[str, Any]:
    if not cfg.drafts:
        return {"drafter": "none"}
    return {
        "drafter": cfg.drafter,
        "tree": dataclasses.asdict(cfg.tree),
        "async_draft": cfg.async_draft,
        "draft_vocab": cfg.draft_vocab,
    }


def hf_generate_kwargs(target: LoadedModel) -> dict[str, Any]:
    """Stop on the same EOS set as the Talon engine."""
    eos = sorted(eos_ids(target))
    pad = target.model.generation_config.pad_token_id
    pad = pad if pad is not None else target.tokenizer.pad_token_id
    return {"eos_token_id": eos, "pad_token_id": pad if pad is not None else (eos[0] if eos else None)}


def assistant_overrides(variant: str) -> dict[str, Any]:
    if variant in ASSISTANT_PRESETS:
        return dict(ASSISTANT_PRESETS[variant])
    return {
        "num_assistant_tokens": int(variant),
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }


def hf_runners(method: str, engine: Engine, cfg: BenchConfig) -> list[Runner]:
    target, draft = engine.target, engine.draft
    base = hf_generate_kwargs(target)
    runners: list[Runner] = []
    if method == "hf-greedy":
        spec = MethodSpec("hf-greedy", "hf-greedy", "hf", {"generate": "do_sample=False"})
        return [HfRunner(spec, target, None, base)]
    if method == "hf-pld":
        for ngram in cfg.pld_ngrams:
            lookup = {"prompt_lookup_num_tokens": cfg.pld_tokens, "max_matching_ngram_size": ngram}
            spec = MethodSpec(f"hf-pld[n={ngram}]", "hf-pld", "hf", {"variant": f"n={ngram}", **lookup}, best_of=True)
            runners.append(HfRunner(spec, target, None, {**base, **lookup}))
        return runners
    for variant in cfg.hf_assistant_tokens:
        overrides = assistant_overrides(variant)
        settings = {"variant": variant, "assistant_generation_config": overrides}
        spec = MethodSpec(f"hf-assisted[{variant}]", "hf-assisted", "hf", settings, best_of=True)
        runners.append(HfRunner(spec, target, draft, {**base, "assistant_model": draft.model}, overrides))
    return runners


def sweep_runners(engine: Engine, sweep: SweepConfig, cost_model: str = "fixed") -> list[Runner]:
    runners: list[Runner] = []
    for cell in sweep.cells():
        base = talon_run_config(sweep.method, talon_async=False, cost_model=cost_model)
        cfg = base.replace(tree=dataclasses.replace(base.tree, budget=cell.budget, root_k=cell.root_k, mu=cell.mu))
        name = f"{sweep.method}[mu={cell.mu:g},N={cell.budget},K={cell.root_k}]"
        spec = MethodSpec(name, sweep.method, "talon", talon_settings(cfg), cell=cell)
        runners.append(TalonRunner(spec, engine, cfg))
    return runners


def build_runners(engine: Engine, cfg: BenchConfig) -> list[Runner]:
    """One runner per method variant (and sweep cell), ``ar`` first."""
    if engine.draft is None and cfg.needs_draft_model():
        needy = [m for m in cfg.methods if m in DRAFT_MODEL_METHODS] + (["--sweep"] if cfg.sweep else [])
        raise ConfigError(f"{', '.join(needy)} need(s) a draft model: pass --draft, or leave them out")
    runners: list[Runner] = []
    for method in cfg.run_methods:
        if method.startswith("llamacpp"):
            continue  # another process: talon.bench.llamacpp
        if method in ("hf-greedy", "hf-assisted", "hf-pld"):
            runners += hf_runners(method, engine, cfg)
        else:
            run_cfg = talon_run_config(method, cfg.talon_async, cfg.cost_model)
            spec = MethodSpec(method, method, "talon", talon_settings(run_cfg))
            runners.append(TalonRunner(spec, engine, run_cfg))
    runners += variant_runners(engine, cfg)
    if cfg.sweep is not None:
        runners += sweep_runners(engine, cfg.sweep, cfg.cost_model)
    return runners
