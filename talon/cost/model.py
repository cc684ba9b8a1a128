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

Each curve is piecewise linear over a fixed grid of sizes (``CURVE_SIZES``). This module is the model
alone, pure Python (the planner imports it, and no torch comes with it):
``talon.cost.probe`` measures the curves on the loaded models (a few seconds; each size repeated
until its best timings agree), ``talon.cost.cache`` keeps them as JSON under a key that names
both models, their dtypes, device and quantization, the draft vocabulary, the forward, the
hardware, the torch version and thread count, and only when the probe was quiet. Every model
records where it came from (``Provenance``: probe or cache, when, on what).

An engine reads the curves once (its *snapshot*) and never changes them during a run: each run
plans on its own copy, frozen (``fixed``: predicted times only, never the wall clock, so the same
command gives the same trees) or refined from its own step timings (``learn``, by least-mean-
squares on the two grid points around each observed size). Predictions are monotone in size.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
from dataclasses import dataclass, field
from typing import Any

from talon.cost.curve import CURVE_SIZES, LEARNING_RATE, Curve, check_times, is_seconds

COST_FORMAT = "talon-cost/1"
ASSUMED_OTHER = "assumed: 5 ms a step beyond its forwards, the cost model's default, until a run measures it"
PROBED = {"verify_s": "probe", "draft_s": "probe", "prefill_per_token_s": "probe", "other_s": ASSUMED_OTHER}


@dataclass(frozen=True)
class Provenance:
    """Where a cost model's curves came from. ``spread``: the largest relative gap between the
    two best timings of one size in the probe (small = a quiet host); ``noisy``: the probe gave
    up before every size was that consistent."""

    source: str = "synthetic"  # "probe" | "cache" | "synthetic" | "derived" (some figures not probed: see fields)
    measured_at: str = ""  # ISO 8601, UTC
    hardware: str = ""  # CPU model or GPU name
    torch: str = ""
    threads: int = 0
    spread: float = 0.0
    noisy: bool = False
    weights: str = ""  # the target's packed weights when probed ("int8-weights" …); "" = dense
    # how each figure was obtained: "probe", "derived: from what, how", "fitted: to what" or
    # "assumed: why" (verify_s, draft_s, prefill_per_token_s, other_s); a probe's own figures
    # are PROBED, its other_s the assumed default
    fields: dict[str, str] = field(default_factory=dict)

    def field_source(self, name: str) -> str:
        """How ``name`` was obtained, as this file says or, for a file that does not, its source."""
        if name in self.fields:
            return self.fields[name]
        if self.source == "synthetic":
            return "synthetic"
        return ASSUMED_OTHER if name == "other_s" else self.source

    def describe(self) -> str:
        """One line for a caption or a log: 'probe, 2026-11-23 20:47 UTC, AMD EPYC, ...'."""
        if self.source == "synthetic":
            return "synthetic (given timings)"
        when = self.measured_at.replace("T", " ").removesuffix("+00:00")[:16] + " UTC" if self.measured_at else "?"
        noise = f"spread {100 * self.spread:.0f}%" + (", noisy host" if self.noisy else "")
        packed = f", target {self.weights}" if self.weights else ""
        other = [f"{k} {v.split()[0].rstrip(':')}" for k, v in self.fields.items() if not v.startswith("probe")]
        return (f"{self.source}, measured {when} on {self.hardware}{packed}, torch {self.torch}, "
                f"{self.threads} threads, {noise}" + (f" ({', '.join(other)})" if other else ""))

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
        return max(self.draft_s(min(tokens, CURVE_SIZES[-1])), self.prefill_per_token_s * tokens)

    def observe_verify(self, tree_tokens: int, seconds: float) -> None:
        with self._lock:
            self.verify.observe(tree_tokens, seconds)
            self.observations += 1

    def observe_draft(self, width: int, seconds: float) -> None:
        if self.draft is None or width > CURVE_SIZES[-1]:
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
            "grid": list(CURVE_SIZES),
            "verify_s": list(self.verify.values),
            "draft_s": list(self.draft.values) if self.draft is not None else None,
            "prefill_per_token_s": self.prefill_per_token_s,
            "other_s": self.other_s,
            "observations": self.observations,
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "CostModel":
        if data.get("format") != COST_FORMAT or list(data.get("grid", [])) != list(CURVE_SIZES):
            raise ValueError(f"not a {COST_FORMAT} file on the sizes {', '.join(map(str, CURVE_SIZES))} "
                             "(in that increasing order)")
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
        if not isinstance(given.get("fields", {}), dict):
            raise ValueError("provenance.fields must map a figure's name to how it was obtained")
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

