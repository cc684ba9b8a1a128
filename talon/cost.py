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

Each curve is piecewise linear over a fixed grid of sizes (``GRID``), probed once per
(model, dtype, device, threads) by :func:`probe_costs` (a few seconds, cached as JSON) and then
refined online from every step's own timings by least-mean-squares on the two grid points around
the observed size. Predictions are monotone in size (a running maximum over the grid).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from talon.curve import GRID, LEARNING_RATE, Curve
from talon.verify import forward_hidden, lm_logits

log = logging.getLogger(__name__)

COST_FORMAT = "talon-cost/1"


@dataclass
class CostModel:
    """The measured cost curves of one target/draft pair on one device, dtype and thread count."""

    verify: Curve
    draft: Curve | None = None
    prefill_per_token_s: float = 0.0
    other_s: float = 0.005
    key: str = ""
    source: str = "probe"  # "probe" | "cache" | "synthetic"
    observations: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

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
            raise ValueError("not a talon-cost/1 file for this grid")
        draft = data.get("draft_s")
        return CostModel(
            verify=Curve([float(v) for v in data["verify_s"]]),
            draft=Curve([float(v) for v in draft]) if draft is not None else None,
            prefill_per_token_s=float(data.get("prefill_per_token_s", 0.0)),
            other_s=float(data.get("other_s", 0.005)),
            key=str(data.get("key", "")),
            source=str(data.get("source", "cache")),
        )

    def copy(self) -> "CostModel":
        return CostModel.from_dict(self.to_dict())


# ------------------------------------------------------------------------------- probing


def cost_key(target: PreTrainedModel, draft: PreTrainedModel | None, names: tuple[str, str]) -> str:
    """What the curves depend on: both models, their dtypes and device, torch's thread count."""
    def describe(model: PreTrainedModel | None, name: str) -> str:
        if model is None:
            return "none"
        quant = getattr(model, "talon_quant", "none")
        return f"{name}:{model.dtype}:{model.device}:{quant}"

    threads = torch.get_num_threads()
    return f"{describe(target, names[0])}|{describe(draft, names[1])}|threads={threads}|probe={PROBE_VERSION}"


def _sync(model: PreTrainedModel) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


PROBE_VERSION = 2  # in the cache key: a better probe re-measures instead of reading an old one


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


def _probe_curve(model: PreTrainedModel, sizes: list[int], prefix: int, vocab: int, reps: int) -> dict[int, float]:
    """Best of ``reps`` per size, the sizes taken round-robin after one warm-up forward, so that a
    slow first call or a burst of other load hits one sample of each size, not all of one."""
    time_once = _forward_timer(model, prefix, vocab, max(sizes))
    time_once(sizes[0])  # warm-up: first-call allocations stay out of the curve
    best = {s: float("inf") for s in sizes}
    for _ in range(reps):
        for s in sizes:
            best[s] = min(best[s], time_once(s))
    return best


def probe_costs(
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    draft_vocab: int = 0,
    prefix: int = 256,
    max_tree: int = 64,
    reps: int = 3,
) -> CostModel:
    """Measure the curves: target forwards of 1..``max_tree`` tokens, draft forwards of 1..32,
    each fitted isotonically (more tokens never cost less)."""
    sizes = [g for g in GRID if g <= max_tree]
    costs = CostModel(verify=Curve.fit_monotone(_probe_curve(target, sizes, prefix, 0, reps)))
    if draft is not None:
        widths = [g for g in GRID if g <= 32]
        costs.draft = Curve.fit_monotone(_probe_curve(draft, widths, prefix, draft_vocab, reps))
        long = _probe_curve(draft, [GRID[-1]], prefix, draft_vocab, 1)[GRID[-1]]
        costs.prefill_per_token_s = long / GRID[-1]
    return costs


def load_or_probe(
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    names: tuple[str, str],
    cache_dir: Path | None,
    draft_vocab: int = 0,
) -> CostModel:
    """The cached curves for this pair and device, or a fresh probe (then cached)."""
    key = cost_key(target, draft, names)
    path = None
    if cache_dir is not None:
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        path = Path(cache_dir) / "costs" / f"{digest}.json"
        if path.is_file():
            try:
                costs = CostModel.from_dict(json.loads(path.read_text(encoding="utf-8")))
                if costs.key == key:
                    costs.source = "cache"
                    return costs
            except (ValueError, KeyError, TypeError, json.JSONDecodeError) as err:
                log.warning("ignoring cost cache %s: %s", path, err)
    start = time.perf_counter()
    costs = probe_costs(target, draft, draft_vocab)
    costs.key = key
    log.info("cost model probed in %.1f s: verify(1)=%.0f ms, verify(16)=%.0f ms, draft(1)=%.0f ms",
             time.perf_counter() - start, 1e3 * costs.verify_s(1), 1e3 * costs.verify_s(16),
             1e3 * costs.draft_s(1))
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
        source="synthetic",
    )

