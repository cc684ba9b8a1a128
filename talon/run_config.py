"""Frozen, validated configuration records.

Every knob a user can turn lives in one of these records; its name, range, default and help are
declared once, in ``talon.knobs``, which gives the fields their defaults and checks them in
``__post_init__`` with a message that says what to change. argparse (CLI), the Gradio UI and the
benchmark all build these records (``RunConfig.with_knobs``); the library never reads raw
strings or environment variables itself (see ``talon.settings``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from talon.knobs import (
    ADMISSIONS,
    COST_MODES,
    DRAFTER_KINDS,
    DRAFTERS,
    DRAFTING_KINDS,
    FEATURE_MODELS,
    MAX_BUDGET,
    TREE_MODES,
    Admission,
    ConfigError,
    CostMode,
    DrafterKind,
    DrafterName,
    MtpLayerRule,
    TreeMode,
    check_record,
    default,
    nested,
    values_of,
)

__all__ = ["ADMISSIONS", "COST_MODES", "DRAFTER_KINDS", "DRAFTING_KINDS", "MAX_BUDGET", "TREE_MODES", "ConfigError",
           "RetrievalConfig", "RunConfig", "SamplingConfig", "TreeConfig"]


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
    cost_aware: goodput planning (``talon.cost.plan``): stop growing when the next layer's expected
        accepted tokens do not pay for its draft forward and extra verification on this
        hardware, trim unprofitable nodes, and skip the draft model on steps where retrieval
        alone is expected to do better per second. Off = pure TALON budget fill.
    admission: what ranks the nodes competing for the budget (adaptive and static trees):
        ``calibrated`` = the acceptance model's P(node accepted), learnt per source during the
        run, so expected accepted length fills the budget; ``confidence`` = the raw path
        confidence prod(q), as in TALON and EAGLE-2. The gates (mu, min_conf) stay on path
        confidence either way.
    """

    mode: TreeMode = default("tree.mode")
    budget: int = default("tree.budget")
    root_k: int = default("tree.root_k")
    top_k: int = default("tree.top_k")
    mu: float = default("tree.mu")
    max_depth: int = default("tree.max_depth")
    min_conf: float = default("tree.min_conf")
    cost_aware: bool = default("tree.cost_aware")
    admission: Admission = default("tree.admission")

    def __post_init__(self) -> None:
        check_record(self, "tree")


@dataclass(frozen=True)
class RetrievalConfig:
    """Retriever knobs.

    min_match: shortest suffix match (tokens) that yields a proposal at all.
    max_continuation: longest continuation drafted from one match.
    graft_threshold: in the hybrid drafter, match length from which the retrieval trie is grafted.
    max_branches: continuations (distinct next tokens) kept per trie node.
    corpus: optional path of a jsonl/text corpus for a static datastore.
    """

    min_match: int = default("retrieval.min_match")
    max_continuation: int = default("retrieval.max_continuation")
    graft_threshold: int = default("retrieval.graft_threshold")
    max_branches: int = default("retrieval.max_branches")
    corpus: str | None = default("retrieval.corpus")

    def __post_init__(self) -> None:
        check_record(self, "retrieval")


@dataclass(frozen=True)
class SamplingConfig:
    """temperature == 0 means greedy decoding; top_k == 0 and top_p == 1 disable the filters."""

    temperature: float = default("sampling.temperature")
    top_p: float = default("sampling.top_p")
    top_k: int = default("sampling.top_k")
    seed: int = default("sampling.seed")

    def __post_init__(self) -> None:
        check_record(self, "sampling")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class RunConfig:
    """One generation: which drafter, which tree, how to sample, when to stop.

    cost_model: how cost-aware planning uses the engine's measured curves. ``fixed``: on the
    snapshot and predicted times alone, never the wall clock, so the same command on the same
    host gives the same trees (the benchmark's default); ``learn``: on a copy refined from this
    run's own step timings (the app's default). Sampled runs always plan fixed.
    """

    drafter: DrafterName = default("drafter")
    tree: TreeConfig = field(default_factory=TreeConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_new_tokens: int = default("max_new_tokens")
    stop_strings: tuple[str, ...] = default("stop_strings")
    chat_template: bool = default("chat_template")
    async_draft: bool = default("async_draft")
    draft_vocab: int = default("draft_vocab")
    mtp_layers: MtpLayerRule = default("mtp_layers")
    cost_model: CostMode = default("cost_model")
    skip_layers: float = default("skip_layers")

    def __post_init__(self) -> None:
        check_record(self, "")

    @property
    def kind(self) -> DrafterKind:
        """The drafter kind's entry in ``talon.knobs.DRAFTERS``."""
        return DRAFTERS[self.drafter]

    @property
    def uses_model(self) -> bool:
        """A model drafts (``hybrid``, ``model``: the draft model; ``layerskip``: the target)."""
        return bool(self.kind.model)

    @property
    def needs_draft_model(self) -> bool:
        """The pair's draft model drafts (``hybrid``, ``model``)."""
        return self.kind.model == "draft"

    @property
    def needs_head(self) -> bool:
        """An EAGLE-3 head in the pair's draft slot drafts (``eagle3``, ``eagle3-hybrid``)."""
        return self.kind.model == "head"

    @property
    def needs_mtp(self) -> bool:
        """The target's own MTP layer drafts (``mtp``, ``mtp-hybrid``)."""
        return self.kind.model == "mtp"

    @property
    def reads_features(self) -> bool:
        """The drafting module reads the target's features (an EAGLE-3 head, MTP layers), so it
        cannot draft the next tree while this one is verified."""
        return self.kind.model in FEATURE_MODELS

    @property
    def uses_draft_slot(self) -> bool:
        """What the pair's draft slot holds drafts: a draft model or an EAGLE-3 head."""
        return self.needs_draft_model or self.needs_head

    @property
    def uses_retrieval(self) -> bool:
        """Retrieval drafts (``hybrid``, ``retrieval``)."""
        return self.kind.retrieval

    @property
    def drafts(self) -> bool:
        """Anything drafts (every kind but ``none``, the autoregressive baseline)."""
        return self.uses_model or self.uses_retrieval

    def replace(self, **changes: object) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    def with_knobs(self, values: Mapping[str, Any], app: bool = False,
                   caps: Mapping[str, float] | None = None) -> "RunConfig":
        """This record with ``{knob name: value}`` changed, each value read from the outside
        (``talon.knobs.Knob.read``: a slider's float, a command line's text; ``app``: the app's
        choices; ``caps``: a server's own upper bounds); ConfigError names the knob. The one way
        into a RunConfig from a front end."""
        data = self.to_dict()
        for section, change in nested(values, app, caps or {}).items():
            if isinstance(change, dict):
                data[section].update(change)
            else:
                data[section] = change
        return RunConfig.from_dict(data)

    def knob_values(self) -> dict[str, Any]:
        """``{knob name: value}`` of this record: the way out, to a front end."""
        return values_of(self.to_dict())

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
