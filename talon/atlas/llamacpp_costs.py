"""llama.cpp's step cost on a host, from its own ``llama-bench``: the ``talon-engine-cost/1``
file (engine ``llamacpp``) that ``talon costs --llama-bench`` writes and ``atlas sweep --engine
llamacpp --costs`` reads (``talon.atlas.llamacpp`` replays what each step drafts)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from talon.atlas.serving_costs import ENGINE_COST_FORMAT
from talon.atlas.serving_replay import Serving


@dataclass(frozen=True)
class LlamaCppCosts:
    """llama.cpp's step cost on one host, from its own ``llama-bench``: the seconds of one decode
    batch of ``n`` tokens for the target and the draft (``pp1`` ... ``ppN`` at the bench's depth),
    linear between measured sizes and beyond the last, plus the prompt's prefill per token.

    A step verifies ``drafted + 1`` tokens in one target batch. With a draft model it adds the
    draft's ``forwards`` single-token decodes and its re-read of the verified batch."""

    target_batch_s: dict[int, float]
    draft_batch_s: dict[int, float] = field(default_factory=dict)
    target_prefill_token_s: float = 0.0
    draft_prefill_token_s: float = 0.0
    step_s: float = 0.0  # the server's own work per step (sampling, bookkeeping), if fitted
    serving: Serving = "llamacpp"
    version: str = ""
    hardware: str = ""
    dtype: str = ""
    measured_at: str = ""
    source: str = ""  # what the curves were read from

    def __post_init__(self) -> None:
        for name in ("target_batch_s", "draft_batch_s"):
            curve = getattr(self, name)
            if not isinstance(curve, dict) or not all(
                    isinstance(n, int) and n >= 1 and _seconds(s) for n, s in curve.items()):
                raise ValueError(f"{name} must map batch sizes (>= 1) to seconds")
        if 1 not in self.target_batch_s:
            raise ValueError("target_batch_s needs the one-token batch (pp1 or tg)")
        for name in ("target_prefill_token_s", "draft_prefill_token_s", "step_s"):
            if not _seconds(getattr(self, name)):
                raise ValueError(f"{name} must be a finite, non-negative number of seconds")

    @property
    def label(self) -> str:
        where = f" on {self.hardware}" if self.hardware else ""
        version = f" {self.version}" if self.version else ""
        return f"llama.cpp{version} batch costs from llama-bench{where} ({self.dtype or 'dtype ?'})"

    def target_s(self, n: int) -> float:
        return _interpolate(self.target_batch_s, n)

    def draft_s(self, n: int) -> float:
        if not self.draft_batch_s:
            raise ValueError("these llama.cpp costs hold no draft model's batches")
        return _interpolate(self.draft_batch_s, n)

    def step_seconds(self, drafted: int, draft_forwards: int, width: int = 1) -> float:
        seconds = self.step_s + self.target_s(drafted + 1)
        if draft_forwards > 0:  # a draft model: its chain, then its re-read of the verified batch
            seconds += draft_forwards * self.draft_s(1) + self.draft_s(drafted + 1)
        return seconds

    def prefill_seconds(self, prompt_tokens: int, has_draft_model: bool) -> float:
        per_token = self.target_prefill_token_s + (self.draft_prefill_token_s if has_draft_model else 0.0)
        return per_token * prompt_tokens

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for name in ("target_batch_s", "draft_batch_s"):
            data[name] = {str(n): s for n, s in sorted(getattr(self, name).items())}
        return {"format": ENGINE_COST_FORMAT, "engine": data.pop("serving"), **data}  # the file's name for it


def _seconds(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


def _interpolate(curve: dict[int, float], n: int) -> float:
    sizes = sorted(curve)
    if n in curve:
        return curve[n]
    if n < sizes[0]:
        return curve[sizes[0]]
    if n > sizes[-1]:
        if len(sizes) == 1:
            return curve[sizes[0]] * n
        a, b = sizes[-2], sizes[-1]
        return curve[b] + (curve[b] - curve[a]) / (b - a) * (n - b)
    return float(np.interp(n, sizes, [curve[s] for s in sizes]))


def parse_llamacpp_costs(data: Any) -> LlamaCppCosts:
    """:class:`LlamaCppCosts` from a parsed ``talon-engine-cost/1`` object whose engine is
    ``llamacpp`` (ValueError says why not)."""
    if not isinstance(data, dict) or data.get("format") != ENGINE_COST_FORMAT or data.get("engine") != "llamacpp":
        raise ValueError(f'not a llama.cpp cost file: expected "format": "{ENGINE_COST_FORMAT}", '
                         '"engine": "llamacpp"')
    known = {f.name for f in dataclasses.fields(LlamaCppCosts)} - {"serving"}
    given = {k: v for k, v in data.items() if k in known}
    for name in ("target_batch_s", "draft_batch_s"):
        curve = given.get(name, {})
        if not isinstance(curve, dict):
            raise ValueError(f"'{name}' must map batch sizes to seconds")
        try:
            given[name] = {int(n): s for n, s in curve.items()}
        except ValueError:
            raise ValueError(f"'{name}' must map batch sizes to seconds") from None
    for name in ("version", "hardware", "dtype", "measured_at", "source"):
        if not isinstance(given.get(name, ""), str):
            raise ValueError(f"'{name}' must be a string")
    try:
        return LlamaCppCosts(**given)
    except TypeError as error:
        raise ValueError(f"malformed llama.cpp cost file: {error}") from None


def costs_from_llama_bench(target: list[dict[str, Any]], draft: list[dict[str, Any]] | None = None,
                           **about: Any) -> LlamaCppCosts:
    """:class:`LlamaCppCosts` from ``llama-bench -o json`` rows of the target (and the draft):
    each ``pN`` row (``n_prompt`` N, ``n_gen`` 0) is one batch of N tokens; the ``tgM`` row's time
    per token is the one-token decode a plain step runs; the largest batch gives the prefill's cost
    per token. Provenance (the bench's build, CPU, threads, depth, model type) goes into the file."""

    def curve(rows: list[dict[str, Any]], role: str) -> tuple[dict[int, float], float, dict[str, Any]]:
        batches: dict[int, float] = {}
        tg = None
        for row in rows:
            try:
                n_prompt, n_gen, ns = int(row["n_prompt"]), int(row["n_gen"]), float(row["avg_ns"])
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{role}: a llama-bench row lacks n_prompt, n_gen or avg_ns") from None
            if n_prompt > 0 and n_gen == 0:
                batches[n_prompt] = ns * 1e-9
            elif n_gen > 0 and n_prompt == 0:
                tg = ns * 1e-9 / n_gen
        if tg is None and 1 not in batches:
            raise ValueError(f"{role}: the llama-bench run holds neither a tg row nor pp1")
        if tg is not None:
            batches[1] = tg
        largest = max(batches)
        first = rows[0]
        meta = {k: first.get(k) for k in ("build_commit", "build_number", "cpu_info", "model_type", "model_size",
                                          "n_threads", "n_depth", "flash_attn", "type_k", "test_time")}
        return batches, batches[largest] / largest, meta

    t_curve, t_prefill, t_meta = curve(target, "target")
    d_curve, d_prefill, d_meta = curve(draft, "draft") if draft else ({}, 0.0, {})
    source = (f"llama-bench (build {t_meta['build_commit']} #{t_meta['build_number']}), {t_meta['n_threads']} threads, "
              f"depth {t_meta['n_depth']}, flash attention {t_meta['flash_attn']}: target {t_meta['model_type']}"
              + (f", draft {d_meta['model_type']}" if draft else ""))
    about.setdefault("hardware", str(t_meta.get("cpu_info") or ""))
    about.setdefault("measured_at", str(t_meta.get("test_time") or ""))
    about.setdefault("dtype", str(t_meta.get("model_type") or ""))
    return LlamaCppCosts(t_curve, d_curve, t_prefill, d_prefill, source=source, **about)
