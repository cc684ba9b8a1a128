"""The Threshold explorer's model, free of Gradio: the knobs (one greedy configuration, named as
``talon generate``'s flags), the grids drawn around them, a browser session's atlas with every
configuration replayed on it (``talon.atlas.loop``, remembered: a replay is deterministic), the
exploration of the knobs (score, heatmaps, Pareto front, best). ``talon.ui.explorer_tab`` puts
it on the page, in the words of ``talon.ui.explorer_tab``; ``talon.server.device`` records and
reads atlas files. Nothing here imports Gradio or builds HTML."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from talon.atlas.adaptive import LengthRun, replay_requests
from talon.atlas.adaptive_sweep import RULES, RuleBest, best_per_rule, make_rule, talon_row
from talon.atlas.data import Atlas
from talon.atlas.replay import replay
from talon.atlas.result import ReplayResult
from talon.atlas.sweep import SweepRow, best_row, pareto, replay_one, result_of
from talon.knobs import (
    ATLAS_DRAFTING_KINDS,
    EXPLORER_KNOBS,
    HEAD_ATLAS_DRAFTING_KINDS,
    MTP_ATLAS_DRAFTING_KINDS,
    MTP_COUNTERPART,
    default,
    slot_kind,
)
from talon.run_config import ConfigError, RunConfig

# the grids drawn around the knobs: the ladder values nearest to the knob's, and the knob's own
MU_LADDER = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0)
BUDGET_LADDER = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
ROOT_K_LADDER = tuple(range(1, 17))
TOP_K_LADDER = tuple(range(1, 9))
GRID_SIDE = 5  # mu x N: 5 x 5 replays
K_GRID_SIDE = 4  # K x k: 4 x 4
MAX_MEMO = 20_000  # replayed configurations kept per session
NO_ATLAS = "no atlas yet: record one for the prompt, or upload one"
# what the explorer replays: a draft model's atlas its kinds, an EAGLE-3 head's its own
EXPLORER_DRAFTERS: tuple[str, ...] = tuple(dict.fromkeys((*ATLAS_DRAFTING_KINDS, *HEAD_ATLAS_DRAFTING_KINDS,
                                                           *MTP_ATLAS_DRAFTING_KINDS)))



# ---------------------------------------------------------------------------------------------
# The knobs: one greedy configuration to replay
# ---------------------------------------------------------------------------------------------


def drafters_of(atlas: Atlas | None) -> tuple[str, ...]:
    """The drafter kinds the explorer offers for ``atlas``: those its draft slot's recording
    replays (an EAGLE-3 head's: eagle3, eagle3-hybrid, retrieval), a draft model's without one."""
    if atlas is not None and atlas.draft_kind == "head":
        return HEAD_ATLAS_DRAFTING_KINDS
    if atlas is not None and atlas.draft_kind == "mtp":
        return MTP_ATLAS_DRAFTING_KINDS
    return ATLAS_DRAFTING_KINDS


@dataclass(frozen=True)
class Knobs:
    """One greedy configuration the explorer replays, named as the knob table names it: its fields
    are ``talon.knobs.EXPLORER_KNOBS``, in order, with their defaults (a test holds them equal)."""

    drafter: str = default("drafter")
    tree: str = default("tree.mode")
    budget: int = default("tree.budget")
    root_k: int = default("tree.root_k")
    top_k: int = default("tree.top_k")
    mu: float = default("tree.mu")
    max_depth: int = default("tree.max_depth")
    min_conf: float = default("tree.min_conf")
    cost_aware: bool = default("tree.cost_aware")
    retrieval_min_match: int = default("retrieval.min_match")
    graft_threshold: int = default("retrieval.graft_threshold")

    @classmethod
    def from_ui(cls, **values: Any) -> "Knobs":
        """Knobs from the UI or API (sliders send floats; ``talon.knobs.Knob.read``); ConfigError
        for a bad value, or for a drafter an atlas does not record."""
        out = {}
        for knob in EXPLORER_KNOBS:
            value = knob.read(values.get(knob.name, knob.default), app=True)
            out[knob.name] = round(value, 6) if knob.kind == "float" else value  # one memo key per slider stop
        if out["drafter"] not in EXPLORER_DRAFTERS:
            raise ConfigError(f"an atlas records the draft slot's and retrieval's children: the explorer replays "
                              f"the drafters {', '.join(EXPLORER_DRAFTERS)}, not {out['drafter']!r}")
        return cls(**out)

    @classmethod
    def from_controls(cls, controls: Any, min_match: int = default("retrieval.min_match")) -> "Knobs":
        """The knobs of the left panel's controls (a ``talon.server.request.Controls``, which has no
        min_match: it is kept)."""
        values = {k.name: getattr(controls, k.app) for k in EXPLORER_KNOBS if k.app}
        return cls.from_ui(**values, retrieval_min_match=min_match)

    def values(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def config(self, atlas: Atlas) -> RunConfig:
        """The greedy RunConfig replayed over ``atlas`` (its draft vocabulary, to its end)."""
        base = RunConfig(max_new_tokens=max(1, len(atlas.output)),
                         draft_vocab=int(atlas.models.get("draft_vocab", RunConfig.draft_vocab)))
        return base.with_knobs(self.values())

    def controls(self) -> dict[str, Any]:
        """The left panel's controls (``Controls`` fields, the app's names) that run this configuration."""
        return {k.app: getattr(self, k.name) for k in EXPLORER_KNOBS if k.app}

    def for_atlas(self, atlas: Atlas | None) -> "Knobs":
        """These knobs with a drafter ``atlas`` replays: the drafter where it does, else its
        counterpart (hybrid and eagle3-hybrid, model and eagle3), else retrieval."""
        kinds = drafters_of(atlas)
        if atlas is not None and atlas.draft_kind == "mtp":
            mtp = self.drafter if self.drafter in kinds else MTP_COUNTERPART.get(self.drafter, kinds[0])
            return dataclasses.replace(self, drafter=mtp)
        head = atlas is not None and atlas.draft_kind == "head"
        return dataclasses.replace(self, drafter=slot_kind(head, kinds, self.drafter))


def around(ladder: Sequence[Any], value: Any, count: int) -> list[Any]:
    """``count`` values of ``ladder`` (plus ``value``) centred on ``value``."""
    values = sorted({*ladder, value})
    i = values.index(value)
    start = max(0, min(i - count // 2, len(values) - count))
    return values[start : start + count]


def mu_budget_grid(knobs: Knobs) -> list[Knobs]:
    return [dataclasses.replace(knobs, mu=mu, budget=n)
            for mu in around(MU_LADDER, knobs.mu, GRID_SIDE) for n in around(BUDGET_LADDER, knobs.budget, GRID_SIDE)]


def root_top_grid(knobs: Knobs) -> list[Knobs]:
    return [dataclasses.replace(knobs, root_k=rk, top_k=tk)
            for rk in around(ROOT_K_LADDER, knobs.root_k, K_GRID_SIDE)
            for tk in around(TOP_K_LADDER, knobs.top_k, K_GRID_SIDE)]


# ---------------------------------------------------------------------------------------------
# A session's atlas and its replays
# ---------------------------------------------------------------------------------------------


@dataclass
class AtlasSession:
    """One browser session's atlas, its download, and every configuration replayed on it."""

    atlas: Atlas | None = None
    download: str | None = None
    rows: dict[Knobs, SweepRow] = field(default_factory=dict)
    result: ReplayResult | None = None  # the knobs' replay: the steps the step view shows
    rules: list[RuleBest] | None = None  # the chain rules at their defaults and best, on this atlas
    rule: str = "hf-heuristic"  # the adaptive rule the explorer draws

    def load(self, atlas: Atlas, download: str | None) -> None:
        self.atlas, self.download, self.rows, self.result, self.rules = atlas, download, {}, None, None

    def adaptive(self, rule: str, knobs: Knobs) -> tuple[LengthRun | None, list[RuleBest]]:
        """``rule``'s replay on the atlas at its best setting, and every rule at its defaults and
        best beside TALON at ``knobs`` (the chain rules searched once an atlas)."""
        if self.atlas is None:
            return None, []
        if self.rules is None:
            self.rules = best_per_rule([self.atlas], rules=RULES[1:])
        talon = talon_row([self.atlas], knobs.config(self.atlas))
        bests = sorted([*self.rules, RuleBest("talon", talon, talon)], key=lambda b: -b.best.tokens_per_s)
        chosen = next((b for b in self.rules if b.rule == rule), None)
        if chosen is None:
            return None, bests
        return replay_requests([self.atlas], make_rule(rule, chosen.best.setting))[0], bests

    def score(self, knobs: Knobs, result: ReplayResult | None = None) -> SweepRow:
        """The replay of ``knobs`` (``result`` when already replayed), remembered (a replay is
        deterministic); ConfigError without an atlas."""
        if self.atlas is None:
            raise ConfigError(NO_ATLAS)
        row = self.rows.get(knobs)
        if row is None:
            if len(self.rows) >= MAX_MEMO:
                self.rows.clear()
            cfg = knobs.config(self.atlas)
            done = result_of(result) if result is not None else replay_one(self.atlas, 0, cfg)
            row = self.rows[knobs] = SweepRow(knobs.values(), cfg, [done])
        return row


@dataclass
class Exploration:
    """The knobs' replay and the configurations around them."""

    result: ReplayResult
    current: SweepRow
    mu_budget: list[SweepRow]
    root_top: list[SweepRow]
    best: SweepRow  # most predicted tokens/s of everything here (talon.atlas.sweep.best_row)
    front: list[SweepRow]  # the Pareto front of everything here

    @property
    def rows(self) -> list[SweepRow]:
        return unique_rows([self.current, *self.mu_budget, *self.root_top])


def unique_rows(rows: Sequence[SweepRow]) -> list[SweepRow]:
    seen: dict[tuple[tuple[str, Any], ...], SweepRow] = {}
    for row in rows:
        seen.setdefault(tuple(row.values.items()), row)
    return list(seen.values())


def explore(session: AtlasSession, knobs: Knobs) -> Exploration:
    """Replay the knobs (with its steps) and the grids around them; ConfigError for bad knobs or
    without an atlas."""
    if session.atlas is None:
        raise ConfigError(NO_ATLAS)
    knobs = knobs.for_atlas(session.atlas)
    result = replay(session.atlas, knobs.config(session.atlas))
    session.result = result
    current = session.score(knobs, result)
    mu_budget = [session.score(k) for k in mu_budget_grid(knobs)]
    root_top = [session.score(k) for k in root_top_grid(knobs)]
    rows = unique_rows([current, *mu_budget, *root_top])
    return Exploration(result, current, mu_budget, root_top, best_row(rows), pareto(rows))


def best_knobs(atlas_state: AtlasSession, knobs: Knobs) -> Knobs:
    """The best configuration around ``knobs`` (most predicted tokens/s); ConfigError without an
    atlas or for bad knobs."""
    if atlas_state.atlas is None:
        raise ConfigError(NO_ATLAS)
    return Knobs.from_ui(**explore(atlas_state, knobs).best.values)
