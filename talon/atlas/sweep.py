"""Sweeps over atlases: every configuration of a grid replayed on every atlas, no model needed.

Grid keys are named as ``talon generate``'s flags (``mu``, ``budget``, ``root_k``, ``top_k``,
``max_depth``, ``min_conf``, ``tree``, ``drafter``, ``cost_aware``, ``admission``,
``retrieval_min_match``, ``graft_threshold``, ...), so a configuration found here is a command
line there. Replays are independent, so the sweep spreads them over worker processes.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from talon.atlas.data import Atlas
from talon.atlas.replay import replay
from talon.atlas.result import ReplayResult
from talon.knobs import ATLAS_KINDS, GRID_KNOBS, HEAD_ATLAS_KINDS, MTP_ATLAS_KINDS, ON_OFF
from talon.run_config import ConfigError, RunConfig


@dataclass(frozen=True)
class GridKey:
    """How one of generate's flags reads a grid value: its type and, for a choice, the choices."""

    kind: Callable[[str], Any]
    choices: tuple[str, ...] = ()


# generate's flags that a sweep may vary (as argparse stores them: the knob table's grid knobs);
# the rest stay as the base command says. An atlas replays the drafters it recorded.
GRID: dict[str, GridKey] = {
    k.name: GridKey({"int": int, "float": float}.get(k.kind, str),
                    ON_OFF if k.kind == "bool"
                    else tuple(c for c in k.choices
                               if k.name != "drafter" or c in ATLAS_KINDS + HEAD_ATLAS_KINDS + MTP_ATLAS_KINDS))
    for k in GRID_KNOBS
}
GRID_KEYS: tuple[str, ...] = tuple(GRID)


@dataclass
class AtlasResult:
    """One configuration replayed on one atlas."""

    atlas: int  # index into the sweep's atlases
    tokens: int
    steps: int
    predicted_s: float
    requests: int
    misses: int
    accept_lens: list[int] = field(default_factory=list)


@dataclass
class SweepRow:
    """One configuration over all atlases: MAT pooled (tokens / steps), predicted tokens/s and
    step time from the atlases' cost models, and how much of it the atlases covered."""

    values: dict[str, Any]  # the grid's values for this configuration
    config: RunConfig
    results: list[AtlasResult]

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.results)

    @property
    def steps(self) -> int:
        return sum(r.steps for r in self.results)

    @property
    def mat(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def predicted_s(self) -> float:
        return sum(r.predicted_s for r in self.results)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.predicted_s if self.predicted_s > 0 else 0.0

    @property
    def step_s(self) -> float:
        return self.predicted_s / self.steps if self.steps else 0.0

    @property
    def coverage(self) -> float:
        asked = sum(r.requests for r in self.results)
        return 1.0 - sum(r.misses for r in self.results) / asked if asked else 1.0

    @property
    def exact(self) -> bool:
        return all(r.misses == 0 for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        return {
            "values": self.values, "config": self.config.to_dict(), "mat": self.mat,
            "tokens_per_s": self.tokens_per_s, "step_s": self.step_s, "predicted_s": self.predicted_s,
            "tokens": self.tokens, "steps": self.steps, "coverage": self.coverage, "exact": self.exact,
            "per_atlas": [{"atlas": r.atlas, "mat": r.tokens / r.steps if r.steps else 0.0, "tokens": r.tokens,
                           "steps": r.steps, "predicted_s": r.predicted_s, "misses": r.misses,
                           "accept_lens": r.accept_lens} for r in self.results],
        }


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    """``KEY=V1,V2`` items -> {key: values}, each value converted and checked as generate's flag
    would; ConfigError names the bad item."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in GRID_KEYS:
            raise ConfigError(f"grid item {item!r}: write KEY=V1,V2 with KEY one of {', '.join(GRID_KEYS)}")
        spec = GRID[key]
        values = []
        for part in (v.strip() for v in text.split(",")):
            try:
                value = spec.kind(part)
            except ValueError:
                raise ConfigError(f"grid {key}: {part!r} is not a valid value") from None
            if spec.choices and value not in spec.choices:
                raise ConfigError(f"grid {key}: {part!r} is not one of {', '.join(spec.choices)}")
            values.append(value)
        if not values or values == [""]:
            raise ConfigError(f"grid {key}: give at least one value")
        grid[key] = list(dict.fromkeys(values))
    return grid


def grid_configs(
    base: argparse.Namespace, grid: dict[str, list[Any]], build: Callable[[argparse.Namespace], RunConfig]
) -> list[tuple[dict[str, Any], RunConfig]]:
    """Every combination of the grid over ``base`` (generate's parsed flags), as RunConfigs
    (ConfigError for a combination the configuration rejects, naming it)."""
    keys = list(grid)
    out = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        values = dict(zip(keys, combo))
        ns = argparse.Namespace(**{**vars(base), **values})
        try:
            out.append((values, build(ns)))
        except ConfigError as error:
            raise ConfigError(f"configuration {values}: {error}") from None
    return out


def replay_one(atlas: Atlas, index: int, cfg: RunConfig) -> AtlasResult:
    return result_of(replay(atlas, cfg), index)


def result_of(result: ReplayResult, index: int = 0) -> AtlasResult:
    """The sweep's record of one replay (atlas ``index`` of the sweep)."""
    s = result.summary
    return AtlasResult(index, len(s.token_ids), s.steps, result.predicted_s,
                       result.coverage.requests, result.coverage.misses,
                       [len(step.accepted) for step in result.steps])


_ATLASES: list[Atlas] = []  # the worker processes' atlases (inherited by fork, set before the pool starts)


def _replay_config(cfg: RunConfig, atlases: Sequence[Atlas] | None = None) -> list[AtlasResult]:
    return [replay_one(atlas, i, cfg) for i, atlas in enumerate(_ATLASES if atlases is None else atlases)]


def run_sweep(
    atlases: Sequence[Atlas], configs: Sequence[tuple[dict[str, Any], RunConfig]], workers: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> list[SweepRow]:
    """Replay every configuration on every atlas; ``workers`` processes (0 = one per core; 1 =
    in this process, safe from any thread)."""
    global _ATLASES
    workers = workers or max(1, min(len(configs), os.cpu_count() or 1))
    cfgs = [cfg for _, cfg in configs]
    results: list[list[AtlasResult]] = []
    if workers == 1 or len(cfgs) == 1:
        for i, cfg in enumerate(cfgs):
            results.append(_replay_config(cfg, atlases))
            if progress:
                progress(i + 1, len(cfgs))
    else:
        _ATLASES = list(atlases)
        try:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
                chunk = max(1, len(cfgs) // (8 * workers))
                for i, res in enumerate(pool.map(_replay_config, cfgs, chunksize=chunk)):
                    results.append(res)
                    if progress:
                        progress(i + 1, len(cfgs))
        finally:
            _ATLASES = []
    return [SweepRow(values, cfg, res) for (values, cfg), res in zip(configs, results)]


def best_row(rows: Sequence[SweepRow]) -> SweepRow:
    """The configuration with the most predicted tokens/s (ties: the higher MAT, then the first)."""
    return max(rows, key=lambda r: (round(r.tokens_per_s, 9), r.mat, -rows.index(r)))


def pareto(rows: Sequence[SweepRow]) -> list[SweepRow]:
    """Rows no other row beats on both MAT (higher) and predicted step time (lower)."""
    return [r for r in rows if not any(
        (o.mat >= r.mat and o.step_s <= r.step_s) and (o.mat > r.mat or o.step_s < r.step_s) for o in rows)]
