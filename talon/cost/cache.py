"""The cost cache: a probe's curves kept as JSON (``talon-cost/1``) under their key, read back
while they are recent (``MAX_AGE_DAYS``), so that the same command on the same host plans on the
same curves (``cost_model="fixed"`` gives the same trees). The cache keeps only what it can trust:

* a probe whose timings of one size stayed more than ``BUSY_SPREAD`` apart was taken while
  something else ran (``busy``: a quiet 2-core host stays under 0.5, a busy one measured 2.2):
  it plans its own run, is never cached, and such an entry is never read;
  a probe merely ``noisy`` (over ``SPREAD_OK``: a 2-core CPU's usual jitter) is kept, flagged;
* a cached curve that a later run's measured steps contradict (``contradicts``: off by more than
  ``CONTRADICTED`` times where both measured) is retired, and the next start probes again.

``python -m talon costs --show`` lists the entries, ``--probe`` measures again."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path

from talon.cost.model import CostModel

logger = logging.getLogger(__name__)

MAX_AGE_DAYS = 30  # a cached model older than this is measured again
BUSY_SPREAD = 1.0  # a probe whose best timings of one size stayed this far apart ran on a busy host
BUSY_FLOOR_S = 0.005  # below this a forward's jitter says nothing of the host (a tiny model's microseconds)
CONTRADICTED = 1.5  # a run's measured step this many times off the cached curve retires the curve


def cache_path(cache_dir: Path, key: str) -> Path:
    return Path(cache_dir) / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def read_cached(path: Path, key: str, max_age_days: float = MAX_AGE_DAYS) -> CostModel | None:
    """The cached curves at ``path`` if they were measured for ``key`` and are recent enough."""
    if not path.is_file():
        return None
    try:
        costs = CostModel.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as err:
        logger.warning("ignoring cost cache %s: %s", path, err)
        return None
    if busy(costs):
        logger.info("cost cache %s was probed on a busy host (spread %.0f%%): measuring again", path,
                    100 * costs.provenance.spread)
        return None
    age = costs.provenance.age_days()
    if costs.key != key or age is None or age > max_age_days:
        logger.info("cost cache %s is stale (%s): measuring again", path,
                    "other key" if costs.key != key else f"{age if age is None else round(age, 1)} days old")
        return None
    costs.provenance = dataclasses.replace(costs.provenance, source="cache")
    return costs


def busy(costs: CostModel) -> bool:
    """Probed while something else ran: its best timings of one size stayed over ``BUSY_SPREAD``
    apart, on forwards long enough (``BUSY_FLOOR_S``) for that to be the host's doing."""
    return costs.provenance.spread > BUSY_SPREAD and costs.verify_s(1) >= BUSY_FLOOR_S


def contradicts(cached: CostModel, measured: CostModel) -> bool:
    """The run's refined curves (``measured``) are more than ``CONTRADICTED`` times off the cached
    ones at a size both hold a measurement for: a verification of 1 or 16 nodes, a 1-token draft."""
    pairs = [(cached.verify_s(n), measured.verify_s(n)) for n in (1, 16)]
    if cached.draft_s(1) > 0 and measured.draft_s(1) > 0:
        pairs.append((cached.draft_s(1), measured.draft_s(1)))
    return any(max(a, b) > CONTRADICTED * min(a, b) for a, b in pairs if a > 0 and b > 0)


def retire_if_contradicted(cache_dir: Path | None, cached: CostModel, measured: CostModel) -> bool:
    """Remove ``cached``'s cache entry when ``measured`` contradicts it: the next start probes again."""
    if cache_dir is None or not contradicts(cached, measured):
        return False
    path = cache_path(cache_dir, cached.key)
    logger.warning("the cached cost curves %s disagree with this run's steps by over %.1fx: retired, the next "
                   "start measures again", path, CONTRADICTED)
    path.unlink(missing_ok=True)
    return True


def save_costs(costs: CostModel, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(costs.to_dict(), indent=1), encoding="utf-8")
        tmp.replace(path)
    except OSError as err:
        logger.warning("could not cache the cost model at %s: %s", path, err)
