"""The Threshold explorer's model, free of Gradio: the knobs (one greedy configuration, named as
``talon generate``'s flags), the grids drawn around them, a browser session's atlas with every
configuration replayed on it (``talon.atlas.replay``, remembered: a replay is deterministic), the
exploration of the knobs (score, heatmaps, Pareto front, best), and the words the panel shows.
``talon.ui.explorer_view`` puts it on the page; ``talon.ui.explorer_io`` records and reads atlas
files. Nothing here imports Gradio."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from talon import figures as F
from talon.atlas.data import Atlas
from talon.atlas.replay import ReplayResult, replay
from talon.atlas.sweep import SweepRow, best_row, pareto, replay_one, result_of
from talon.run_config import DRAFTING_KINDS, TREE_MODES, ConfigError, RetrievalConfig, RunConfig, TreeConfig

# the grids drawn around the knobs: the ladder values nearest to the knob's, and the knob's own
MU_LADDER = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0)
BUDGET_LADDER = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
ROOT_K_LADDER = tuple(range(1, 17))
TOP_K_LADDER = tuple(range(1, 9))
GRID_SIDE = 5  # mu x N: 5 x 5 replays
K_GRID_SIDE = 4  # K x k: 4 x 4
MAX_MEMO = 20_000  # replayed configurations kept per session



# ---------------------------------------------------------------------------------------------
# The knobs: one greedy configuration to replay
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Knobs:
    """What the explorer varies, named as ``talon generate``'s flags (``talon.atlas.sweep``)."""

    drafter: str = RunConfig.drafter
    tree: str = TreeConfig.mode
    budget: int = TreeConfig.budget
    root_k: int = TreeConfig.root_k
    top_k: int = TreeConfig.top_k
    mu: float = TreeConfig.mu
    max_depth: int = TreeConfig.max_depth
    min_conf: float = TreeConfig.min_conf
    retrieval_min_match: int = RetrievalConfig.min_match
    graft_threshold: int = RetrievalConfig.graft_threshold
    cost_aware: bool = TreeConfig.cost_aware

    @classmethod
    def from_ui(cls, **values: Any) -> Knobs:
        """Knobs from the UI or API (sliders send floats); ConfigError for a bad value."""
        ints = {"budget", "root_k", "top_k", "max_depth", "retrieval_min_match", "graft_threshold"}
        out: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            value = values.get(f.name, f.default)
            if f.name in ints:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
                    raise ConfigError(f"{f.name} must be an integer, got {value!r}")
                value = int(value)
            elif f.name in ("mu", "min_conf"):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise ConfigError(f"{f.name} must be a number, got {value!r}")
                value = round(float(value), 6)
            elif f.name == "cost_aware":
                value = value is True
            out[f.name] = value
        if out["drafter"] not in DRAFTING_KINDS:
            raise ConfigError(f"drafter must be one of {DRAFTING_KINDS}, got {out['drafter']!r}")
        if out["tree"] not in TREE_MODES:
            raise ConfigError(f"tree mode must be one of {TREE_MODES}, got {out['tree']!r}")
        return cls(**out)

    @classmethod
    def from_controls(cls, controls: Any, min_match: int = RetrievalConfig.min_match) -> Knobs:
        """The knobs of the left panel's controls (a ``talon.ui.controls.Controls``, which has no
        min_match: it is kept)."""
        return cls.from_ui(drafter=controls.drafter, tree=controls.tree_mode, budget=controls.budget,
                           root_k=controls.root_k, top_k=controls.top_k, mu=controls.mu,
                           max_depth=controls.max_depth, min_conf=controls.min_conf,
                           retrieval_min_match=min_match, graft_threshold=controls.retrieval_threshold,
                           cost_aware=controls.cost_aware)

    def values(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def config(self, atlas: Atlas) -> RunConfig:
        """The greedy RunConfig replayed over ``atlas`` (its draft vocabulary, to its end)."""
        tree = TreeConfig(mode=self.tree, budget=self.budget, root_k=self.root_k, top_k=self.top_k,  # type: ignore[arg-type]
                          mu=self.mu, max_depth=self.max_depth, min_conf=self.min_conf, cost_aware=self.cost_aware)
        retrieval = RetrievalConfig(min_match=self.retrieval_min_match, graft_threshold=self.graft_threshold)
        return RunConfig(drafter=self.drafter, tree=tree, retrieval=retrieval,  # type: ignore[arg-type]
                         max_new_tokens=max(1, len(atlas.output)),
                         draft_vocab=int(atlas.models.get("draft_vocab", RunConfig.draft_vocab)))

    def controls(self) -> dict[str, Any]:
        """The left panel's controls (``Controls`` fields) that run this configuration."""
        return {"drafter": self.drafter, "tree_mode": self.tree, "budget": self.budget, "root_k": self.root_k,
                "top_k": self.top_k, "mu": self.mu, "max_depth": self.max_depth, "min_conf": self.min_conf,
                "retrieval_threshold": self.graft_threshold, "cost_aware": self.cost_aware}


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

    def load(self, atlas: Atlas, download: str | None) -> None:
        self.atlas, self.download, self.rows, self.result = atlas, download, {}, None

    def score(self, knobs: Knobs, result: ReplayResult | None = None) -> SweepRow:
        """The replay of ``knobs`` (``result`` when already replayed), remembered (a replay is
        deterministic)."""
        assert self.atlas is not None
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
    """Replay the knobs (with its steps) and the grids around them; ConfigError for bad knobs."""
    assert session.atlas is not None
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
        raise ConfigError("no atlas yet: record one for the prompt, or upload one")
    return Knobs.from_ui(**explore(atlas_state, knobs).best.values)



# ---------------------------------------------------------------------------------------------
# Words: the greedy-only note, progress, what the atlas holds, what Apply did
# ---------------------------------------------------------------------------------------------


def greedy_note(temperature: Any) -> str:
    """Said while the temperature control is above 0: the explorer replays greedy decoding only."""
    if not isinstance(temperature, (int, float)) or temperature <= 0:
        return ""
    return (f'<div class="talon-greedy-note">Exact replay is greedy only: the explorer scores temperature 0. '
            f"With temperature {float(temperature):g} on the left, sampled runs accept differently (the atlas does "
            "not hold the target's probabilities), so sampling is out of its scope.</div>")


def progress_html(fraction: float, message: str) -> str:
    width = max(0.0, min(1.0, fraction)) * 100
    return (f'<div class="talon-progress"><div class="bar" style="width: {width:.0f}%"></div></div>'
            f'<div class="talon-status">{F.esc(message)}</div>')


def atlas_words(atlas: Atlas | None) -> str:
    """What the loaded atlas holds, in one line."""
    if atlas is None:
        return ('<div class="talon-status">No atlas yet. <b>Record</b> one for the prompt on the left (the models '
                "run once), or upload one; then every knob below re-scores instantly, with no model.</div>")
    record = atlas.record
    took = f", recorded in {record['run_s'] + record['atlas_s']:.1f} s" if {"run_s", "atlas_s"} <= set(record) else ""
    prompt = atlas.prompt if len(atlas.prompt) <= 80 else atlas.prompt[:79] + "…"
    return (f'<div class="talon-atlas-held">Atlas of “{F.esc(prompt)}”: {len(atlas.output)} tokens of the target\'s '
            f"greedy text, {len(atlas.children):,} draft nodes (up to N {atlas.spec.n_nodes}, K {atlas.spec.root_k}, "
            f"k {atlas.spec.top_k}, depth {atlas.spec.max_depth}){took}; "
            f"{F.esc(str(atlas.models.get('target', '')))} with {F.esc(str(atlas.models.get('draft', '')))}.</div>")


def apply_words(knobs: Knobs, what: str) -> str:
    words = f"Applied {what} to the controls on the left: {F.config_words(knobs.values())}."
    if knobs.retrieval_min_match != RetrievalConfig.min_match:
        words += (f" Min match {knobs.retrieval_min_match} has no control there (runs use "
                  f"{RetrievalConfig.min_match}); on the command line: --retrieval-min-match "
                  f"{knobs.retrieval_min_match}.")
    return words + (" The prompt box, the length and greedy sampling are the atlas's: press Run to decode it "
                    "for real.")
