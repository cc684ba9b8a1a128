"""What a serving engine's step costs on a host, and the tokens/s a serving replay predicts from it.

An engine step verifies ``drafted + 1`` tokens in one target forward and, with a draft model,
runs that model's forwards for the next draft. On the CPUs these are measured on, the time is
close to linear in both, so :class:`ServingCosts` holds four numbers, fitted by non-negative least
squares on an engine's own per-request timings (``scripts/serve_check.py`` reads them from vLLM's
per-request metrics)::

    step seconds    = step_s + verify_token_s * (drafted + 1) + draft_forward_s * draft forwards
    prefill seconds = prompt tokens * (prefill_token_s + draft_prefill_token_s if a draft model)

Its file format is ``talon-engine-cost/1``, validated like any upload (:func:`parse_serving_costs`).
Without one, :class:`TalonCurves` stands in: the atlas's own ``talon-cost/1`` curves of Talon's
loop on the recording host (verify of T tokens, draft forwards of the engine's width), labelled as
such: the shape of the trade-off, not the engine's overheads.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from talon.atlas.serving_replay import Serving, ServingRun
from talon.cost.model import CostModel

ENGINE_COST_FORMAT = "talon-engine-cost/1"
COEFFICIENTS = ("step_s", "verify_token_s", "draft_forward_s")


class StepCosts(Protocol):
    label: str

    def step_seconds(self, drafted: int, draft_forwards: int, width: int) -> float: ...

    def prefill_seconds(self, prompt_tokens: int, has_draft_model: bool) -> float: ...


@dataclass(frozen=True)
class ServingCosts:
    """A serving engine's step cost on one host (see the module docstring); ``samples`` keep the
    measurements it was fitted on."""

    serving: Serving
    step_s: float
    verify_token_s: float = 0.0
    draft_forward_s: float = 0.0
    prefill_token_s: float = 0.0
    draft_prefill_token_s: float = 0.0
    version: str = ""
    hardware: str = ""
    dtype: str = ""
    measured_at: str = ""
    samples: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("step_s", "verify_token_s", "draft_forward_s", "prefill_token_s", "draft_prefill_token_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite, non-negative number of seconds, got {value!r}")
        if self.step_s + self.verify_token_s <= 0:
            raise ValueError("a step must cost something: step_s + verify_token_s must be positive")

    @property
    def label(self) -> str:
        where = f" on {self.hardware}" if self.hardware else ""
        return f"{self.serving} {self.version} step costs measured{where} ({self.dtype or 'dtype ?'})"

    def step_seconds(self, drafted: int, draft_forwards: int, width: int = 1) -> float:
        return self.step_s + self.verify_token_s * (drafted + 1) + self.draft_forward_s * draft_forwards

    def prefill_seconds(self, prompt_tokens: int, has_draft_model: bool) -> float:
        per_token = self.prefill_token_s + (self.draft_prefill_token_s if has_draft_model else 0.0)
        return per_token * prompt_tokens

    def to_dict(self) -> dict[str, Any]:
        """The ``talon-engine-cost/1`` object; the file names the serving engine ``engine``."""
        data = dataclasses.asdict(self)
        return {"format": ENGINE_COST_FORMAT, "engine": data.pop("serving"), **data}


def parse_serving_costs(data: Any) -> ServingCosts:
    """An :class:`ServingCosts` from a parsed ``talon-engine-cost/1`` object (ValueError says why not)."""
    if not isinstance(data, dict) or data.get("format") != ENGINE_COST_FORMAT:
        raise ValueError(f'not an engine cost file: expected "format": "{ENGINE_COST_FORMAT}"')
    known = {f.name for f in dataclasses.fields(ServingCosts)}
    given = {k: v for k, v in {**data, "serving": data.get("engine")}.items() if k in known}
    if given["serving"] not in ("vllm", "sglang"):
        raise ValueError("'engine' must be vllm or sglang")
    for name in ("version", "hardware", "dtype", "measured_at"):
        if not isinstance(given.get(name, ""), str):
            raise ValueError(f"'{name}' must be a string")
    if not isinstance(given.get("samples", []), list):
        raise ValueError("'samples' must be a list")
    try:
        return ServingCosts(**given)
    except TypeError as error:
        raise ValueError(f"malformed engine cost file: {error}") from None


@dataclass(frozen=True)
class TalonCurves:
    """Talon's own measured curves of the recording host standing in for an engine's step cost."""

    costs: CostModel

    @property
    def label(self) -> str:
        return (f"Talon's own cost curves of the recording host ({self.costs.provenance.describe()}), "
                "standing in for the engine's")

    def step_seconds(self, drafted: int, draft_forwards: int, width: int = 1) -> float:
        return (self.costs.verify_s(drafted + 1) + draft_forwards * self.costs.draft_s(max(width, 1))
                + self.costs.other_s)

    def prefill_seconds(self, prompt_tokens: int, has_draft_model: bool) -> float:
        return 0.0  # Talon's curves hold no target prefill: ranks stay right, absolute tok/s run high


def predicted_seconds(run: ServingRun, costs: StepCosts, width: int = 1) -> float:
    """Prefill plus every step of ``run`` under ``costs`` (``width``: the draft forwards' rows,
    SGLang's topk)."""
    return costs.prefill_seconds(run.prompt_tokens, run.draft_forwards_per_step > 0) + decode_seconds(run, costs, width)


def decode_seconds(run: ServingRun, costs: StepCosts, width: int = 1) -> float:
    """Every verify step of ``run`` under ``costs``: the time from the first token to the last."""
    return sum(costs.step_seconds(step.drafted, run.draft_forwards_per_step if step.forwards is None else step.forwards,
                                  width) for step in run.steps)


def fit_serving_costs(samples: list[dict[str, float]], serving: Serving, **about: Any) -> ServingCosts:
    """Fit :class:`ServingCosts` to per-request measurements. Each sample: ``steps``,
    ``verified_tokens`` (sum of drafted + 1 over its steps), ``draft_forwards``, ``decode_s`` (the
    engine's first-to-last token time), ``prompt_tokens``, ``prefill_s`` and ``draft_model`` (0/1).
    Non-negative least squares (every subset of the coefficients, the best feasible fit)."""
    if not samples:
        raise ValueError("no samples to fit engine costs on")
    x = np.array([[s["steps"], s["verified_tokens"], s["draft_forwards"]] for s in samples], dtype=float)  # (S, 3)
    y = np.array([s["decode_s"] for s in samples], dtype=float)  # (S,)
    coef = _nnls(x, y)
    plain = [s for s in samples if not s["draft_model"] and s["prompt_tokens"]]
    drafted = [s for s in samples if s["draft_model"] and s["prompt_tokens"]]
    prefill = sum(s["prefill_s"] for s in plain) / sum(s["prompt_tokens"] for s in plain) if plain else 0.0
    with_draft = prefill
    if drafted:
        with_draft = sum(s["prefill_s"] for s in drafted) / sum(s["prompt_tokens"] for s in drafted)
    if not plain:
        prefill, with_draft = with_draft, with_draft
    return ServingCosts(serving, *(float(c) for c in coef), prefill_token_s=prefill,
                       draft_prefill_token_s=max(with_draft - prefill, 0.0), samples=list(samples), **about)


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """argmin ||x c - y|| subject to c >= 0, for a handful of columns: try every support."""
    best, best_err = np.zeros(x.shape[1]), float("inf")
    for size in range(1, x.shape[1] + 1):
        for cols in itertools.combinations(range(x.shape[1]), size):
            sub, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if (sub < 0).any():
                continue
            c = np.zeros(x.shape[1])
            c[list(cols)] = sub
            err = float(np.sum((x @ c - y) ** 2))
            if err < best_err and c[0] + c[1] > 0:
                best, best_err = c, err
    if best_err == float("inf"):
        raise ValueError("engine costs: no non-negative fit (are the timings positive?)")
    return best
