"""Losslessness: is each output the target's greedy output, and where it is not, was the first
difference a near-tie (numerical noise deciding an argmax) or a real mismatch?"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from talon.bench.config import DivergenceKind, EngineKind
from talon.models import LoadedModel

log = logging.getLogger("talon.bench")


def default_tie_tol(dtype: torch.dtype) -> float:
    """Absolute floor of the near-tie tolerance, in logits, for a model run in ``dtype``."""
    return 1e-3 if dtype == torch.float32 else 0.05


def tie_tolerance(abs_tol: float, dtype: torch.dtype, best_logit: float, ulps: int = 2) -> float:
    """``abs_tol`` plus ``ulps`` rounding steps of ``dtype`` at the best logit's magnitude.

    The methods compared logits rounded to ``dtype``: in bfloat16 a logit near 16 moves in steps
    of 0.125, so two logits closer than a step or two cannot be told apart by the run itself.
    """
    if best_logit == 0.0:
        return abs_tol
    _, exponent = math.frexp(abs(best_logit))  # |best| = m * 2**exponent, 0.5 <= m < 1
    return abs_tol + ulps * torch.finfo(dtype).eps * 2.0 ** (exponent - 1)


@dataclass(frozen=True)
class Verdict:
    """How a method's output first departs from ar's. Gaps are in logits, in the judge's dtype."""

    position: int  # index into the new tokens
    kind: DivergenceKind
    ar_token: int | None  # None: that output had already stopped
    method_token: int | None
    logit_gap: float | None  # |logit(ar_token) - logit(method_token)|
    top2_gap: float | None  # best logit - second best
    tolerance: float | None  # near-tie iff both tokens are within this of the best logit


@dataclass(frozen=True)
class Divergence:
    suite: str
    prompt_index: int
    method: str  # the variant's unique name
    engine: EngineKind
    verdict: Verdict

    def to_dict(self) -> dict[str, Any]:
        where = {"suite": self.suite, "prompt_index": self.prompt_index}
        return {**where, "method": self.method, "engine": self.engine, **dataclasses.asdict(self.verdict)}


def first_divergence(ar_ids: Sequence[int], got_ids: Sequence[int]) -> int | None:
    """First position where the outputs differ (a length difference counts); None if equal."""
    for i, (a, b) in enumerate(zip(ar_ids, got_ids)):
        if a != b:
            return i
    return None if len(ar_ids) == len(got_ids) else min(len(ar_ids), len(got_ids))


class TieJudge:
    """Tells a near-tie (both tokens within ``tie_tolerance`` of the target's best logit) from a
    mismatch; ``abs_tol`` is the tolerance's absolute floor.

    The target's logits are recomputed with one plain forward over prompt + common prefix; a
    model loaded in a half dtype is upcast to float32 on a private copy, built on first use.
    """

    def __init__(self, target: LoadedModel, abs_tol: float, upcast: bool = True) -> None:
        self.target = target
        self.abs_tol = abs_tol
        self.upcast = upcast and target.dtype != torch.float32
        self._model: PreTrainedModel | None = None

    def judge(self, prompt_ids: list[int], ar_ids: list[int], got_ids: list[int]) -> Verdict | None:
        pos = first_divergence(ar_ids, got_ids)
        if pos is None:
            return None
        if pos >= min(len(ar_ids), len(got_ids)):
            ar_token = ar_ids[pos] if pos < len(ar_ids) else None
            got_token = got_ids[pos] if pos < len(got_ids) else None
            return Verdict(pos, "mismatch", ar_token, got_token, None, None, None)
        logits = self.next_logits(prompt_ids + list(ar_ids[:pos]))  # (V,)
        a, b = ar_ids[pos], got_ids[pos]
        top2 = logits.topk(2).values
        best = top2[0].item()
        tol = tie_tolerance(self.abs_tol, self.target.dtype, best)
        near = best - min(logits[a].item(), logits[b].item()) <= tol
        return Verdict(
            pos, "near_tie" if near else "mismatch", a, b,
            abs(logits[a] - logits[b]).item(), best - top2[1].item(), tol,
        )

    @torch.inference_mode()
    def next_logits(self, ids: list[int]) -> torch.Tensor:
        """(V,) float32: the target's next-token logits after ``ids``."""
        model = self._judge_model()
        input_ids = torch.tensor([ids], device=model.device)  # (1, L)
        return model(input_ids=input_ids, logits_to_keep=1).logits[0, -1].float()

    def _judge_model(self) -> PreTrainedModel:
        if not self.upcast:
            return self.target.model
        if self._model is None:
            try:
                self._model = copy.deepcopy(self.target.model).float()
                log.info("near-tie checks: target upcast to float32")
            except (RuntimeError, MemoryError) as err:
                log.warning("near-tie checks in %s (float32 copy failed: %s)", self.target.dtype, err)
                self.upcast = False
                return self.target.model
        return self._model

    def release(self) -> None:
        self._model = None
