"""What a step costs on this hardware: verification and drafting time as functions of size.

A step's speed is (accepted tokens + 1) / (draft time + verification time + overhead). On a GPU,
verifying 1 or 64 nodes costs about the same; on a 2-core CPU the target is compute-bound past a
few tokens (the embedded 1.5B: 130 ms for 1 token, 255 ms for 24) and one draft layer costs a
third of a target step. :class:`CostModel` holds those curves for one loaded pair, on its device
and dtype:

* ``verify_s(T)``: one target forward over T tree nodes (root included), LM head included.
* ``draft_s(W)``: one draft-model forward over a frontier of W nodes, draft head included.
* ``prefill_s(L)``: the draft model's catch-up / prompt prefill of L tokens.
* ``other_s``: per-step bookkeeping (acceptance, cache commit, traces).

Each curve is piecewise linear over a fixed grid of sizes (``GRID``), probed by
:func:`probe_costs` (a few seconds; each size repeated until its best timings agree) and cached
as JSON under a key that names both models, their dtypes, device and quantization, the draft
vocabulary, the hardware (CPU model or GPU name), the torch version and thread count; a cached
model older than ``MAX_AGE_DAYS`` is measured again. Every model records where it came from
(``Provenance``: probe or cache, when, on what).

An engine reads the curves once (its *snapshot*) and never changes them during a run: each run
plans on its own copy, frozen (``fixed``: predicted times only, never the wall clock, so the same
command gives the same trees) or refined from its own step timings (``learn``, by least-mean-
squares on the two grid points around each observed size). Predictions are monotone in size.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from talon.curve import GRID, LEARNING_RATE, Curve, check_times, is_seconds
from talon.models.device import hardware_name
from talon.verify import forward_hidden, lm_logits

log = logging.getLogger(__name__)

COST_FORMAT = "talon-cost/1"
PROBE_VERSION = 4  # in the cache key: a better probe (or cheaper drafting: 4 = the int8 draft head) re-measures
MAX_AGE_DAYS = 30  # a cached model older than this is measured again
SPREAD_OK = 0.05  # a size is measured until its two best timings agree within this share
MIN_REPS, MAX_REPS = 3, 6


@dataclass(frozen=True)
class Provenance:
    """Where a cost model's curves came from. ``spread``: the largest relative gap between the
    two best timings of one size in the probe (small = a quiet host); ``noisy``: the probe gave
    up before every size was that consistent."""

    source: str = "synthetic"  # "probe" | "cache" | "synthetic"
    measured_at: str = ""  # ISO 8601, UTC
    hardware: str = ""  # CPU model or GPU name
    torch: str = ""
    threads: int = 0
    spread: float = 0.0
    noisy: bool = False
    weights: str = ""  # the target's packed weights when probed ("int8-weights" …); "" = dense

    def describe(self) -> str:
        """One line for a caption or a log: 'probe, 2026-11-23 20:47 UTC, AMD EPYC, ...'."""
        if self.source == "synthetic":
            return "synthetic (given timings)"
        when = self.measured_at.replace("T", " ").removesuffix("+00:00")[:16] + " UTC" if self.measured_at else "?"
        noise = f"spread {100 * self.spread:.0f}%" + (", noisy host" if self.noisy else "")
        packed = f", target {self.weights}" if self.weights else ""
        return (f"{self.source}, measured {when} on {self.hardware}{packed}, torch {self.torch}, "
                f"{self.threads} threads, {noise}")

    def age_days(self, now: datetime.datetime | None = None) -> float | None:
        if not self.measured_at:
            return None
        now = now or datetime.datetime.now(datetime.UTC)
        return (now - datetime.datetime.fromisoformat(self.measured_at)).total_seconds() / 86400


@dataclass
class CostModel:
    """The measured cost curves of one target/draft pair on one device, dtype and thread count."""

    verify: Curve
    draft: Curve | None = None
    prefill_per_token_s: float = 0.0
    other_s: float = 0.005
    key: str = ""
    provenance: Provenance = field(default_factory=Provenance)
    observations: int = 0  # step timings folded in (learn mode)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def source(self) -> str:
        return self.provenance.source

    def verify_s(self, tree_tokens: int) -> float:
        return self.verify(tree_tokens)

    def draft_s(self, width: int) -> float:
        return self.draft(width) if self.draft is not None else 0.0

    def prefill_s(self, tokens: int) -> float:
        """Draft-model catch-up of ``tokens`` committed tokens (the prompt prefill when unengaged)."""
        if tokens <= 0:
            return 0.0
        return max(self.draft_s(min(tokens, GRID[-1])), self.prefill_per_token_s * tokens)

    def observe_verify(self, tree_tokens: int, seconds: float) -> None:
        with self._lock:
            self.verify.observe(tree_tokens, seconds)
            self.observations += 1

    def observe_draft(self, width: int, seconds: float) -> None:
        if self.draft is None or width > GRID[-1]:
            return  # a long catch-up is a prefill, not a layer
        with self._lock:
            self.draft.observe(width, seconds)

    def observe_other(self, seconds: float) -> None:
        with self._lock:
            self.other_s += LEARNING_RATE * (min(seconds, 4 * self.other_s + 0.01) - self.other_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": COST_FORMAT,
            "key": self.key,
            "source": self.source,
            "provenance": dataclasses.asdict(self.provenance),
            "described": self.provenance.describe(),
            "grid": list(GRID),
            "verify_s": list(self.verify.values),
            "draft_s": list(self.draft.values) if self.draft is not None else None,
            "prefill_per_token_s": self.prefill_per_token_s,
            "other_s": self.other_s,
            "observations": self.observations,
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "CostModel":
        if data.get("format") != COST_FORMAT or list(data.get("grid", [])) != list(GRID):
            raise ValueError(f"not a {COST_FORMAT} file on the sizes {', '.join(map(str, GRID))} (in that increasing order)")
        draft = data.get("draft_s")
        check_times(data.get("verify_s"), "verify_s")
        if draft is not None:
            check_times(draft, "draft_s")
        for name in ("prefill_per_token_s", "other_s"):
            value = data.get(name, 0.0)
            if not is_seconds(value) or value < 0:
                raise ValueError(f"{name} must be a finite, non-negative number of seconds, got {value!r}")
        known = {f.name for f in dataclasses.fields(Provenance)}
        given = {k: v for k, v in (data.get("provenance") or {}).items() if k in known}
        provenance = Provenance(**{"source": str(data.get("source", "cache")), **given})
        return CostModel(
            verify=Curve([float(v) for v in data["verify_s"]]),
            draft=Curve([float(v) for v in draft]) if draft is not None else None,
            prefill_per_token_s=float(data.get("prefill_per_token_s", 0.0)),
            other_s=float(data.get("other_s", 0.005)),
            key=str(data.get("key", "")),
            provenance=provenance,
            observations=int(data.get("observations", 0)),
        )

    def copy(self) -> "CostModel":
        return CostModel.from_dict(self.to_dict())


# ------------------------------------------------------------------------------- probing


def cost_key(
    target: PreTrainedModel, draft: PreTrainedModel | None, names: tuple[str, str], draft_vocab: int = 0,
    step: str = "dynamic",
) -> str:
    """What the curves depend on: both models (dtype, device, quantization), the draft
    vocabulary (the draft head's width), how a step runs (``Engine(step=...)``), the hardware,
    torch's version and thread count."""
    def describe(model: PreTrainedModel | None, name: str) -> str:
        if model is None:
            return "none"
        quant = getattr(model, "talon_quant", "none")
        return f"{name}:{model.dtype}:{model.device}:{quant}"

    host = hardware_name(target.device)
    return (f"{describe(target, names[0])}|{describe(draft, names[1])}|draft_vocab={draft_vocab}|"
            f"hw={host}|torch={torch.__version__}|threads={torch.get_num_threads()}|probe={PROBE_VERSION}"
            + ("" if step == "dynamic" else f"|step={step}"))


def cache_path(cache_dir: Path, key: str) -> Path:
    return Path(cache_dir) / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _sync(model: PreTrainedModel) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


Timer = Callable[[PreTrainedModel, int, int, int], Callable[[int], float]]


def _forward_timer(model: PreTrainedModel, prefix: int, vocab: int, max_size: int):
    """A function timing one forward of ``size`` new tokens over a ``prefix``-token cache (the
    timed tokens are dropped again after each call)."""
    cache = DynamicCache(config=model.config)
    ids = torch.randint(0, min(model.config.vocab_size, 1000), (prefix + max_size,))
    forward_hidden(model, cache, ids[:prefix], torch.arange(prefix), None)

    def time_once(size: int) -> float:
        _sync(model)
        start = time.perf_counter()
        hidden = forward_hidden(model, cache, ids[prefix : prefix + size], torch.arange(prefix, prefix + size), None)
        lm_logits(model, hidden, vocab)
        _sync(model)
        seconds = time.perf_counter() - start
        cache.crop(-size)
        return seconds

    return time_once


@dataclass(frozen=True)
class Probed:
    best: dict[int, float]  # size -> best seconds
    spread: float  # largest (second best - best) / best over the sizes

    @property
    def noisy(self) -> bool:
        return self.spread > SPREAD_OK


def spread_of(times: list[float]) -> float:
    """(second best - best) / best: how far the best timing is from being confirmed."""
    if len(times) < 2:
        return float("inf")
    first, second = sorted(times)[:2]
    return (second - first) / max(first, 1e-12)


def _probe_curve(model: PreTrainedModel, sizes: list[int], prefix: int, vocab: int,
                 min_reps: int = MIN_REPS, max_reps: int = MAX_REPS, timer: Timer | None = None) -> Probed:
    """Best timing per size, the sizes taken round-robin after one warm-up forward (so a slow
    first call or a burst of other load hits one sample of each size, not all of one), repeated
    until every size's two best timings agree within ``SPREAD_OK`` or ``max_reps`` rounds ran."""
    time_once = (timer or _forward_timer)(model, prefix, vocab, max(sizes))
    try:
        time_once(sizes[0])  # warm-up: first-call allocations stay out of the curve
        times: dict[int, list[float]] = {s: [] for s in sizes}
        for rep in range(max_reps):
            for s in sizes:
                times[s].append(time_once(s))
            spread = max(spread_of(t) for t in times.values())
            if rep + 1 >= min_reps and spread <= SPREAD_OK:
                break
    finally:
        if hasattr(time_once, "close"):
            time_once.close()
    return Probed({s: min(t) for s, t in times.items()}, spread)


def probe_costs(
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    draft_vocab: int = 0,
    prefix: int = 256,
    max_tree: int = 64,
    max_reps: int = MAX_REPS,
    timers: tuple[Timer | None, Timer | None] = (None, None),
) -> CostModel:
    """Measure the curves: target forwards of 1..``max_tree`` tokens, draft forwards of 1..32,
    each fitted isotonically (more tokens never cost less). ``timers``: how the target's and
    the draft's forwards run (None: a dynamic cache; ``talon.static.static_timer``: the static
    step, replayed graphs included)."""
    sizes = [g for g in GRID if g <= max_tree]
    verify = _probe_curve(target, sizes, prefix, 0, max_reps=max_reps, timer=timers[0])
    spread = verify.spread
    costs = CostModel(verify=Curve.fit_monotone(verify.best))
    if draft is not None:
        widths = [g for g in GRID if g <= 32]
        drafted = _probe_curve(draft, widths, prefix, draft_vocab, max_reps=max_reps, timer=timers[1])
        costs.draft = Curve.fit_monotone(drafted.best)
        long = _probe_curve(draft, [GRID[-1]], prefix, draft_vocab, min_reps=1, max_reps=1,
                            timer=timers[1]).best[GRID[-1]]
        costs.prefill_per_token_s = long / GRID[-1]
        spread = max(spread, drafted.spread)
    costs.provenance = Provenance(
        source="probe",
        measured_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        hardware=hardware_name(target.device),
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        spread=round(spread, 4),
        noisy=spread > SPREAD_OK,
        weights=getattr(target, "talon_quant", ""),
    )
    if costs.provenance.noisy:
        log.warning("cost probe: the host is noisy (best timings of one size %.0f%% apart after %d rounds); "
                    "the curves may be pessimistic", 100 * spread, max_reps)
    return costs


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


def synthetic_costs(verify: dict[int, float], draft: dict[int, float] | None = None,
                    other_s: float = 0.0, prefill_per_token_s: float = 0.0) -> CostModel:
    """A cost model from given timings (tests, and what-if views)."""
    return CostModel(
        verify=Curve.fit(verify),
        draft=Curve.fit(draft) if draft else None,
        prefill_per_token_s=prefill_per_token_s,
        other_s=other_s,
        key="synthetic",
    )

