"""What a benchmark run is asked to do: suites, methods, budgets, sweep cells, and the
names every other part of ``talon.bench`` shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from talon.knobs import KNOB, default
from talon.run_config import ConfigError, RunConfig, TreeConfig

BENCH_FORMAT = "talon-bench/1"
METHODS: tuple[str, ...] = ("ar", "hf-greedy", "hf-assisted", "hf-pld", "chain", "static", "adaptive", "hybrid",
                            "layerskip", "talon", "llamacpp", "llamacpp-spec")
# run by default: llama.cpp's methods need its side environment (scripts/llamacpp_build.sh)
DEFAULT_METHODS: tuple[str, ...] = tuple(m for m in METHODS if not m.startswith("llamacpp"))
SWEEP_METHODS: tuple[str, ...] = ("talon", "hybrid", "adaptive")
DRAFT_MODEL_METHODS: tuple[str, ...] = ("hf-assisted", "chain", "static", "adaptive", "hybrid", "talon")
ALL_SUITES_ROW = "all"
EQUAL_BUDGET = 24  # the budget at which the tree baselines are compared
DEFAULT_LIMIT = 3  # prompts per suite by default: all six suites, every method, under an hour here
DEFAULT_MAX_NEW_TOKENS = 64
# Assistant generation_config overrides; an int n means {num_assistant_tokens: n, constant, no
# confidence stop}: a fixed-length chain, like Talon's "chain" tree.
ASSISTANT_PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "heuristic": {
        "num_assistant_tokens": 5,
        "num_assistant_tokens_schedule": "heuristic_transient",
        "assistant_confidence_threshold": 0.0,
    },
}

RunnerKind = Literal["talon", "hf", "llamacpp"]


class BenchError(ValueError):
    """The benchmark cannot run as asked (unknown suite, missing data); the message says what to do."""


@dataclass(frozen=True)
class SweepCell:
    mu: float
    budget: int
    root_k: int


@dataclass(frozen=True)
class SweepConfig:
    """Grid over the gate mu, the budget N and the root width K for one adaptive-tree method:
    ``talon`` (the default configuration, cost-aware), ``hybrid`` (planning off) or ``adaptive``
    (the draft model alone); every other knob stays the method's own."""

    method: str = "talon"
    mus: tuple[float, ...] = (0.02, 0.05, 0.1, 0.2, 0.4)
    budgets: tuple[int, ...] = (8, 16, 24, 32, 48)
    root_ks: tuple[int, ...] = (TreeConfig().root_k,)

    def __post_init__(self) -> None:
        if self.method not in SWEEP_METHODS:
            raise ConfigError(f"sweep method must be one of {SWEEP_METHODS}, got {self.method!r}")
        if not (self.mus and self.budgets and self.root_ks):
            raise ConfigError("a sweep needs at least one mu, one budget and one root_k")
        for cell in self.cells():
            TreeConfig(mode="adaptive", budget=cell.budget, root_k=cell.root_k, mu=cell.mu)

    def cells(self) -> list[SweepCell]:
        return [SweepCell(mu, n, k) for k in self.root_ks for mu in self.mus for n in self.budgets]


@dataclass(frozen=True)
class BenchConfig:
    """What to run. ``ar`` always runs (every speedup and lossless check is relative to it).

    hf_assistant_tokens: assisted-generation variants, each an int (fixed draft length, constant
    schedule) or "default" (transformers' defaults) or "heuristic" (length adapted per step);
    the fastest variant per suite is reported as ``hf-assisted``.
    pld_ngrams: prompt-lookup variants, each a ``max_matching_ngram_size`` (transformers' default
    is 2, the original prompt-lookup recipe uses 3); the fastest per suite is reported as ``hf-pld``.
    talon_variants: extra ``talon[...]`` rows, each the default configuration with the given
    ``key=value[,key=value]`` changes (``talon.bench.runners.talon_variant``).
    tie_tol: absolute floor of the near-tie tolerance in logits; None = ``default_tie_tol``.
    atlas: also record a draft atlas of every prompt (``talon.atlas``), written to the output
    folder's ``atlases/``, so defaults can be tuned across the suites with no further model runs.
    cost_model: ``RunConfig.cost_model`` of every Talon method; ``fixed`` (the default) plans every
    run on the same snapshot of the measured curves, never on the wall clock, so rows and
    repeated runs are independent of each other and of the host's load.
    """

    methods: tuple[str, ...] = DEFAULT_METHODS
    max_new_tokens: int = default("max_new_tokens")
    hf_assistant_tokens: tuple[str, ...] = ("4", "8", "default")
    pld_tokens: int = 10
    pld_ngrams: tuple[int, ...] = (2, 3)
    talon_async: bool = False
    sweep: SweepConfig | None = None
    talon_variants: tuple[str, ...] = ()
    tie_tol: float | None = None
    warmup_tokens: int = 8
    cost_model: str = KNOB["cost_model"].bench
    atlas: bool = False

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ConfigError(f"unknown method(s) {', '.join(unknown)}: choose from {', '.join(METHODS)}")
        RunConfig(max_new_tokens=self.max_new_tokens)  # validates the range
        bad = [v for v in self.hf_assistant_tokens if v not in ASSISTANT_PRESETS and not _is_positive_int(v)]
        if bad or not self.hf_assistant_tokens:
            raise ConfigError(
                f"hf assistant tokens must be positive integers or one of {sorted(ASSISTANT_PRESETS)}, got {bad}"
            )
        if self.pld_tokens < 1:
            raise ConfigError(f"pld tokens must be >= 1, got {self.pld_tokens}")
        if not self.pld_ngrams or any(n < 1 for n in self.pld_ngrams):
            raise ConfigError(f"pld n-gram sizes must be integers >= 1, got {self.pld_ngrams}")
        if self.tie_tol is not None and self.tie_tol < 0:
            raise ConfigError(f"tie tolerance must be >= 0, got {self.tie_tol}")
        RunConfig(cost_model=self.cost_model)  # validates the mode
        if self.warmup_tokens < 0:
            raise ConfigError(f"warm-up tokens must be >= 0 (0 = no warm-up), got {self.warmup_tokens}")

    @property
    def run_methods(self) -> tuple[str, ...]:
        """The methods that run: ``ar`` first, then the others in the order given."""
        return ("ar",) + tuple(dict.fromkeys(m for m in self.methods if m != "ar"))

    def needs_draft_model(self) -> bool:
        extra = self.sweep is not None or bool(self.talon_variants) or self.atlas
        return extra or any(m in DRAFT_MODEL_METHODS for m in self.methods)


def _is_positive_int(value: str) -> bool:
    return value.isdigit() and int(value) > 0
