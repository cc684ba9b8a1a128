"""A host's one-off verdicts, kept: whether bfloat16 beats float32 here (``talon.models.device``)
and whether oneDNN's weight layout beats torch's float32 matmul (``talon.models.prepack``).

Each is a timed check of one layer, repeated in rounds. A one-off check flipped with the host's
load from one start to the next (the layout's: 0.26x to 2.71x at one row; the dtype's: bf16
chosen in one start and float32 in the next on a 2-core Xeon with AMX, where bf16 decodes the
embedded pair 1.7x to 2.6x faster), so the verdict is decided once per host (``host_key``: the
CPU, its cores, torch's version and threads) and kept beside the cost curves
(``TALON_COST_CACHE``, default ``TALON_CACHE/costs``), in ``<check>/``, with its
figures; every later start on the host reads it and says so in the log. A verdict whose rounds
disagree (a start under load) holds for that start only: it is off, and not kept."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from talon.settings import Settings

VERDICT_ROUNDS = 3  # a check, repeated: "on" only where every round clears its rule


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def host_key() -> dict[str, object]:
    """What a verdict depends on: the CPU, its cores, torch's version and threads."""
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__,
            "threads": torch.get_num_threads()}


@dataclass(frozen=True)
class HostVerdict:
    """A check's answer: ``on`` where every round cleared the rule; ``margin`` how far the
    nearest round cleared it (over 1) or missed it (under 1); ``rounds`` the figures; ``settled``
    where the rounds agree (rounds that disagree are inside the noise: the answer is off, for this
    start only)."""

    on: bool
    margin: float
    rounds: list[Any] = field(default_factory=list)
    settled: bool = True


Times = dict[int, tuple[float, float]]  # rows -> (the baseline's seconds, the candidate's)


@dataclass(frozen=True)
class RowsRule:
    """A candidate against a baseline, both timed at one row and at a tree's rows: it pays where it
    is at least ``tree_speedup`` x faster at the tree's rows and at most ``row_slowdown`` x slower
    at one row (a decode step's)."""

    tree_speedup: float
    row_slowdown: float
    rows: tuple[int, int] = (1, 16)

    def pays(self, times: Times) -> bool:
        (row_base, row_cand), (tree_base, tree_cand) = times[self.rows[0]], times[self.rows[1]]
        return tree_base / tree_cand >= self.tree_speedup and row_cand / row_base <= self.row_slowdown

    def margin(self, times: Times) -> float:
        """How far these times clear the rule (over 1) or miss it (under 1): the smaller of the
        tree's speedup over its need and the one-row allowance over its slowdown."""
        (row_base, row_cand), (tree_base, tree_cand) = times[self.rows[0]], times[self.rows[1]]
        return min(tree_base / tree_cand / self.tree_speedup, self.row_slowdown / (row_cand / row_base))

    def judge(self, rounds: list[Times], title: str, log: logging.Logger, choice: tuple[str, str]) -> HostVerdict:
        """The verdict of these rounds, logged as ``title`` with the figures and ``choice`` (the
        words for off, on): on only where every round pays; rounds that disagree are unsettled."""
        paid = sum(self.pays(times) for times in rounds)
        on, least = paid == len(rounds), min(self.margin(times) for times in rounds)
        log.info("%s, %d rounds: %s (need %.2fx at %d rows, at most %.2fx slower at %d; %d of %d rounds pay, margin "
                 "%.2fx%s) -> %s", title, len(rounds),
                 "; ".join(", ".join(f"{r} rows {1e3 * b:.2f} / {1e3 * c:.2f} ms ({b / c:.2f}x)"
                                     for r, (b, c) in times.items()) for times in rounds),
                 self.tree_speedup, self.rows[1], self.row_slowdown, self.rows[0], paid, len(rounds), least,
                 ": inside the noise" if 0 < paid < len(rounds) else "", choice[on])
        return HostVerdict(on, least, [{str(r): [b, c] for r, (b, c) in t.items()} for t in rounds],
                           settled=paid in (0, len(rounds)))


def verdict_path(cache_dir: Path, check: str, key: dict[str, object]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir / check / f"verdict-{digest}.json"


def read_verdict(path: Path, key: dict[str, object]) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("key") == key and isinstance(data.get("on"), bool) else None


def kept_verdict(check: str, key: dict[str, object], decide: Callable[[], HostVerdict], log: logging.Logger,
                 what: str) -> bool:
    """The verdict of ``check`` on this host: kept in the cache under ``key`` (``host_key`` plus
    the rule's own terms), else ``decide``d now and kept. ``what`` names the choice in the log
    ("TALON_PREPACK auto = %s", with "on" or "off"); a verdict read back is logged with its date
    and margin."""
    path = verdict_path(Settings.from_env().cost_cache_dir, check, key)  # beside the measured cost curves
    if (kept := read_verdict(path, key)) is not None:
        log.info("%s verdict kept in %s (decided %s, margin %.2fx): %s", check, path, kept.get("decided", "?"),
                 float(kept.get("margin", 0.0)), what % ("on" if kept["on"] else "off"))
        return kept["on"]
    verdict = decide()
    if not verdict.settled:  # a busy start: not kept, so the next start checks again
        log.info("%s verdict inside the noise, not kept: the next start checks again", check)
        return verdict.on
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": key, "on": verdict.on, "margin": round(verdict.margin, 4),
                                    "decided": time.strftime("%Y-%m-%d"), "rounds": verdict.rounds}),
                        encoding="utf-8")
    except OSError as error:  # a read-only cache: decide again next start
        log.warning("%s verdict not kept (%s): the next start checks again", check, error)
    return verdict.on
