"""Frozen, validated configuration records.

Every knob a user can turn lives here, validated in ``__post_init__`` with a message that says
what to change. argparse (CLI), the Gradio UI and the benchmark all build these records; the
library never reads raw strings or environment variables itself (see ``talon.settings``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

TreeMode = Literal["adaptive", "static", "chain"]
DrafterKind = Literal["hybrid", "model", "retrieval", "none"]
Admission = Literal["calibrated", "confidence"]

TREE_MODES: tuple[str, ...] = ("adaptive", "static", "chain")
DRAFTER_KINDS: tuple[str, ...] = ("hybrid", "model", "retrieval", "none")
DRAFTING_KINDS: tuple[str, ...] = tuple(d for d in DRAFTER_KINDS if d != "none")  # the kinds that draft
ADMISSIONS: tuple[str, ...] = ("calibrated", "confidence")


class ConfigError(ValueError):
    """A knob is out of range; the message names the knob, the value and the allowed range."""


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _int_in(name: str, value: object, lo: int, hi: int) -> None:
    _check(
        isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi,
        f"{name} must be an integer in [{lo}, {hi}], got {value!r}",
    )


def _float_in(name: str, value: object, lo: float, hi: float) -> None:
    _check(
        isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= float(value) <= hi,
        f"{name} must be a number in [{lo}, {hi}], got {value!r}",
    )


MAX_BUDGET = 256  # draft nodes one verification may hold


@dataclass(frozen=True)
class TreeConfig:
    """Shape of the draft tree.

    budget: N, draft nodes verified per target forward (root excluded).
    root_k: K, children of the root (the root layer is never gated).
    top_k: k, children proposed per expanded node at depth >= 1.
    mu: gate; a frontier node expands only if path_conf >= mu * (best path_conf in its layer).
    max_depth: deepest layer the builder may reach.
    min_conf: cost stop (adaptive and chain): a layer is expanded only while the best path
        confidence in it is >= min_conf; each layer costs one draft forward, so on a slow
        drafter deep guesses that will probably be rejected are not worth drafting. 0 = off.
    cost_aware: goodput planning (``talon.plan``): stop growing when the next layer's expected
        accepted tokens do not pay for its draft forward and extra verification on this
        hardware, trim unprofitable nodes, and skip the draft model on steps where retrieval
        alone is expected to do better per second. Off = pure TALON budget fill.
    admission: what ranks the nodes competing for the budget (adaptive and static trees):
        ``calibrated`` = the acceptance model's P(node accepted), learnt per source during the
        run, so expected accepted length fills the budget; ``confidence`` = the raw path
        confidence prod(q), as in TALON and EAGLE-2. The gates (mu, min_conf) stay on path
        confidence either way.
    """

    mode: TreeMode = "adaptive"
    budget: int = 16
    root_k: int = 4
    top_k: int = 2
    mu: float = 0.1
    max_depth: int = 8
    min_conf: float = 0.2
    cost_aware: bool = True
    admission: Admission = "calibrated"

    def __post_init__(self) -> None:
        _check(isinstance(self.cost_aware, bool), f"cost_aware must be true or false, got {self.cost_aware!r}")
        _check(self.admission in ADMISSIONS, f"admission must be one of {ADMISSIONS}, got {self.admission!r}")
        _check(self.mode in TREE_MODES, f"tree mode must be one of {TREE_MODES}, got {self.mode!r}")
        _int_in("budget", self.budget, 1, MAX_BUDGET)
        _int_in("root_k", self.root_k, 1, 64)
        _int_in("top_k", self.top_k, 1, 16)
        _float_in("mu", self.mu, 0.0, 1.0)
        _int_in("max_depth", self.max_depth, 1, 64)
        _float_in("min_conf", self.min_conf, 0.0, 1.0)


@dataclass(frozen=True)
class RetrievalConfig:
    """Retrieval drafter knobs.

    min_match: shortest suffix match (tokens) that yields a proposal at all.
    max_continuation: longest continuation drafted from one match.
    graft_threshold: in the hybrid drafter, match length from which the retrieval trie is grafted.
    max_branches: continuations (distinct next tokens) kept per trie node.
    corpus: optional path of a jsonl/text corpus for a static datastore.
    """

    min_match: int = 2
    max_continuation: int = 16
    graft_threshold: int = 3
    max_branches: int = 2
    corpus: str | None = None

    def __post_init__(self) -> None:
        _int_in("retrieval min_match", self.min_match, 1, 64)
        _int_in("retrieval max_continuation", self.max_continuation, 1, 128)
        _int_in("retrieval graft_threshold", self.graft_threshold, 1, 64)
        _int_in("retrieval max_branches", self.max_branches, 1, 16)


@dataclass(frozen=True)
class SamplingConfig:
    """temperature == 0 means greedy decoding; top_k == 0 and top_p == 1 disable the filters."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        _float_in("temperature", self.temperature, 0.0, 10.0)
        _float_in("top_p", self.top_p, 1e-6, 1.0)
        _int_in("sampling top_k", self.top_k, 0, 1_000_000)
        _int_in("seed", self.seed, 0, 2**63 - 1)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


COST_MODES: tuple[str, ...] = ("fixed", "learn")


@dataclass(frozen=True)
class RunConfig:
    """One generation: which drafter, which tree, how to sample, when to stop.

    cost_model: how cost-aware planning uses the engine's measured curves. ``fixed``: on the
    snapshot and predicted times alone, never the wall clock, so the same command on the same
    host gives the same trees (the benchmark's default); ``learn``: on a copy refined from this
    run's own step timings (the app's default). Sampled runs always plan fixed.
    """

    drafter: DrafterKind = "hybrid"
    tree: TreeConfig = field(default_factory=TreeConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_new_tokens: int = 128
    stop_strings: tuple[str, ...] = ()
    chat_template: bool = True
    async_draft: bool = False
    draft_vocab: int = 32768
    cost_model: str = "learn"

    def __post_init__(self) -> None:
        _check(
            self.drafter in DRAFTER_KINDS,
            f"drafter must be one of {DRAFTER_KINDS}, got {self.drafter!r}",
        )
        _int_in("max_new_tokens", self.max_new_tokens, 1, 1_000_000)
        _check(
            all(isinstance(s, str) and s for s in self.stop_strings),
            "stop strings must be non-empty strings",
        )
        _int_in("draft_vocab", self.draft_vocab, 0, 10_000_000)
        _check(self.cost_model in COST_MODES, f"cost_model must be one of {COST_MODES}, got {self.cost_model!r}")

    @property
    def uses_model(self) -> bool:
        """The draft model drafts (``hybrid``, ``model``)."""
        return self.drafter in ("hybrid", "model")

    @property
    def uses_retrieval(self) -> bool:
        """Retrieval drafts (``hybrid``, ``retrieval``)."""
        return self.drafter in ("hybrid", "retrieval")

    @property
    def drafts(self) -> bool:
        """Anything drafts (every kind but ``none``, the autoregressive baseline)."""
        return self.uses_model or self.uses_retrieval

    def replace(self, **changes: object) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(data: dict) -> "RunConfig":
        data = dict(data)
        data["tree"] = TreeConfig(**data.get("tree", {}))
        data["retrieval"] = RetrievalConfig(**data.get("retrieval", {}))
        data["sampling"] = SamplingConfig(**data.get("sampling", {}))
        data["stop_strings"] = tuple(data.get("stop_strings", ()))
        return RunConfig(**data)
