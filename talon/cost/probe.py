"""The cost probe: times the loaded models' forwards at the grid's sizes (``talon.cost.model``'s
curves), each size repeated until its two best timings agree, and names what the curves depend
on (``cost_key``); ``load_or_probe`` reads the cache (``talon.cost.cache``) or probes. Torch and the
models live here, not in the pure model the planner reads nor in the cache's files."""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DynamicCache, PreTrainedModel

from talon.core.forward import forward_hidden
from talon.cost.cache import busy, cache_path, read_cached, save_costs
from talon.cost.curve import CURVE_SIZES, Curve
from talon.cost.model import PROBED, CostModel, Provenance
from talon.models.device import hardware_name
from talon.models.head import lm_logits

logger = logging.getLogger(__name__)

PROBE_VERSION = 4  # in the cache key: a better probe (or cheaper drafting: 4 = the int8 draft head) re-measures
SPREAD_OK = 0.05  # a size is measured until its two best timings agree within this share
MIN_REPS, MAX_REPS = 3, 6


def cost_key(
    target: PreTrainedModel, draft: PreTrainedModel | None, names: tuple[str, str], draft_vocab: int = 0,
    forward: str = "dynamic",
) -> str:
    """What the curves depend on: both models (dtype, device, quantization), the draft
    vocabulary (the draft head's width), how the forwards run (``Engine(forward=...)``), the hardware,
    torch's version and thread count."""
    def describe(model: PreTrainedModel | None, name: str) -> str:
        if model is None:
            return "none"
        quant = getattr(model, "talon_quant", "none")
        return f"{name}:{model.dtype}:{model.device}:{quant}"

    host = hardware_name(target.device)
    return (f"{describe(target, names[0])}|{describe(draft, names[1])}|draft_vocab={draft_vocab}|"
            f"hw={host}|torch={torch.__version__}|threads={torch.get_num_threads()}|probe={PROBE_VERSION}"
            + ("" if forward == "dynamic" else f"|forward={forward}"))


def _sync(model: PreTrainedModel) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


Timer = Callable[[PreTrainedModel, int, int, int], Callable[[int], float]]


def random_prefix(model: PreTrainedModel, prefix: int, ids: torch.Tensor) -> DynamicCache:
    """A ``prefix``-entry cache for ``model`` to attend over: its first entry a real forward (which
    fixes each layer's shape, dtype and device), the rest random keys and values of that shape.
    A forward's time does not depend on what the cache holds, and a real prefill of the probe's
    256 tokens costs as much as a round of the probe's sizes (9 s on the float32 embedded target,
    a 2-core host; 4 s of it the first touch of the weights, which a real forward still pays)."""
    cache = DynamicCache(config=model.config)
    forward_hidden(model, cache, ids[:1], torch.arange(1), None)
    generator = torch.Generator("cpu").manual_seed(0)
    with torch.inference_mode():
        for i, layer in enumerate(cache.layers):
            extra = [(*t.shape[:2], prefix - 1, *t.shape[3:]) for t in (layer.keys, layer.values)]
            k, v = (torch.randn(shape, generator=generator).to(layer.keys.device, layer.keys.dtype) for shape in extra)
            cache.update(k, v, i)
    return cache


def _forward_timer(model: PreTrainedModel, prefix: int, vocab: int, max_size: int):
    """A function timing one forward of ``size`` new tokens over a ``prefix``-token cache (the
    timed tokens are dropped again after each call)."""
    ids = torch.randint(0, min(model.config.vocab_size, 1000), (prefix + max_size,))
    cache = random_prefix(model, prefix, ids)

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
    first call or a burst of other load hits one sample of each size, not all of one). Each size
    is timed ``min_reps`` times, then again each round only while its two best timings disagree
    by more than ``SPREAD_OK``, for at most ``max_reps`` rounds: a size whose timings agree is
    measured, and a noisy host repeats only the sizes it disturbed."""
    time_once = (timer or _forward_timer)(model, prefix, vocab, max(sizes))
    try:
        time_once(sizes[0])  # warm-up: first-call allocations stay out of the curve
        times: dict[int, list[float]] = {s: [] for s in sizes}
        for rep in range(max_reps):
            pending = [s for s in sizes if rep < min_reps or spread_of(times[s]) > SPREAD_OK]
            if not pending:
                break
            for s in pending:
                times[s].append(time_once(s))
    finally:
        if hasattr(time_once, "close"):
            time_once.close()
    return Probed({s: min(t) for s, t in times.items()}, max(spread_of(t) for t in times.values()))


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
    the draft's forwards run (None: a dynamic cache; ``talon.graphs.pool.static_timer``: the static
    step, replayed graphs included)."""
    sizes = [g for g in CURVE_SIZES if g <= max_tree]
    verify = _probe_curve(target, sizes, prefix, 0, max_reps=max_reps, timer=timers[0])
    spread = verify.spread
    costs = CostModel(verify=Curve.fit_monotone(verify.best))
    if draft is not None:
        widths = [g for g in CURVE_SIZES if g <= 32]
        drafted = _probe_curve(draft, widths, prefix, draft_vocab, max_reps=max_reps, timer=timers[1])
        costs.draft = Curve.fit_monotone(drafted.best)
        long = _probe_curve(draft, [CURVE_SIZES[-1]], prefix, draft_vocab, min_reps=1, max_reps=1,
                            timer=timers[1]).best[CURVE_SIZES[-1]]
        costs.prefill_per_token_s = long / CURVE_SIZES[-1]
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
        fields={k: v for k, v in PROBED.items() if draft is not None or k == "verify_s" or k == "other_s"},
    )
    if costs.provenance.noisy:
        logger.warning("cost probe: the host is noisy (best timings of one size %.0f%% apart after %d rounds); "
                       "the curves may be pessimistic", 100 * spread, max_reps)
    return costs


def load_or_probe(
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    names: tuple[str, str],
    cache_dir: Path | None,
    draft_vocab: int = 0,
    refresh: bool = False,
    forward: str = "dynamic",
    timers: tuple[Timer | None, Timer | None] = (None, None),
) -> CostModel:
    """The cached curves for this pair, vocabulary, forward and hardware, or a fresh probe (then
    cached under ``cache_dir``, when given). ``refresh``: probe even when a cached model exists."""
    key = cost_key(target, draft, names, draft_vocab, forward)
    path = cache_path(cache_dir, key) if cache_dir is not None else None
    if path is not None and not refresh and (cached := read_cached(path, key)) is not None:
        logger.info("cost model: %s", cached.provenance.describe())
        return cached
    start = time.perf_counter()
    costs = probe_costs(target, draft, draft_vocab, timers=timers)
    costs.key = key
    logger.info("cost model probed in %.1f s: verify(1)=%.0f ms, verify(16)=%.0f ms, draft(1)=%.0f ms (%s)",
                time.perf_counter() - start, 1e3 * costs.verify_s(1), 1e3 * costs.verify_s(16),
                1e3 * costs.draft_s(1), costs.provenance.describe())
    if path is not None and busy(costs):
        logger.warning("cost probe taken on a busy host (spread %.0f%%): used for this run, not cached",
                       100 * costs.provenance.spread)
    elif path is not None:
        save_costs(costs, path)
    return costs
