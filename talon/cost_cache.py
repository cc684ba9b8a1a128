"""The cost cache: a probe's curves kept as JSON (``talon-cost/1``) under their key, read back
while they are recent (``MAX_AGE_DAYS``), so that the same command on the same host plans on the
same curves (``cost_model="fixed"`` gives the same trees). A probe taken on a busy host is kept
too, flagged ``noisy`` with its spread (``python -m talon costs --show`` lists it, ``--probe``
measures again)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from pathlib import Path

from transformers import PreTrainedModel

from talon.cost import CostModel
from talon.cost_probe import Timer, cost_key, probe_costs

log = logging.getLogger(__name__)

MAX_AGE_DAYS = 30  # a cached model older than this is measured again


def cache_path(cache_dir: Path, key: str) -> Path:
    return Path(cache_dir) / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def read_cached(path: Path, key: str, max_age_days: float = MAX_AGE_DAYS) -> CostModel | None:
    """The cached curves at ``path`` if they were measured for ``key`` and are recent enough."""
    if not path.is_file():
        return None
    try:
        costs = CostModel.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as err:
        log.warning("ignoring cost cache %s: %s", path, err)
        return None
    age = costs.provenance.age_days()
    if costs.key != key or age is None or age > max_age_days:
        log.info("cost cache %s is stale (%s): measuring again", path,
                 "other key" if costs.key != key else f"{age if age is None else round(age, 1)} days old")
        return None
    costs.provenance = dataclasses.replace(costs.provenance, source="cache")
    return costs


def load_or_probe(
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    names: tuple[str, str],
    cache_dir: Path | None,
    draft_vocab: int = 0,
    refresh: bool = False,
    step: str = "dynamic",
    timers: tuple[Timer | None, Timer | None] = (None, None),
) -> CostModel:
    """The cached curves for this pair, vocabulary, step and hardware, or a fresh probe (then
    cached under ``cache_dir``, when given). ``refresh``: probe even when a cached model exists."""
    key = cost_key(target, draft, names, draft_vocab, step)
    path = cache_path(cache_dir, key) if cache_dir is not None else None
    if path is not None and not refresh and (cached := read_cached(path, key)) is not None:
        log.info("cost model: %s", cached.provenance.describe())
        return cached
    start = time.perf_counter()
    costs = probe_costs(target, draft, draft_vocab, timers=timers)
    costs.key = key
    log.info("cost model probed in %.1f s: verify(1)=%.0f ms, verify(16)=%.0f ms, draft(1)=%.0f ms (%s)",
             time.perf_counter() - start, 1e3 * costs.verify_s(1), 1e3 * costs.verify_s(16),
             1e3 * costs.draft_s(1), costs.provenance.describe())
    if path is not None:
        save_costs(costs, path)
    return costs


def save_costs(costs: CostModel, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(costs.to_dict(), indent=1), encoding="utf-8")
        tmp.replace(path)
    except OSError as err:
        log.warning("could not cache the cost model at %s: %s", path, err)
