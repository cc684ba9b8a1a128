"""Losslessness, token by token: is every token of an output the target's greedy choice given the
tokens before it, and where it is not, was it a near-tie (numerical noise deciding an argmax) or
a real mismatch?

Each output is teacher-forced through the target (upcast to float32) in one forward over
prompt + output, so every position is checked against the target's logits *given the method's
own prefix*: a near-tie early on does not hide what comes after it, and the reference is the
target itself, not another decoding loop.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from talon.bench.options import RunnerKind
from talon.models import LoadedModel
from talon.models.quant import is_packed

logger = logging.getLogger("talon.bench")


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
class Mismatch:
    """The first position whose token the target would not have chosen. Gaps are in logits
    (float32); ``token``/``best_token`` None: the output stopped where it should not have."""

    position: int  # index into the new tokens
    reason: str  # "not the target's choice" | "stopped early" | "went on after EOS"
    token: int | None
    best_token: int | None
    logit_gap: float | None  # best logit - logit(token)
    top2_gap: float | None  # best logit - second best
    tolerance: float | None


@dataclass(frozen=True)
class TokenCheck:
    """Every position of one output, checked. ``near_ties``: positions whose token was within
    the tolerance of the best logit but not the argmax (both are the target's choice, up to
    rounding)."""

    positions: int
    near_ties: list[int] = field(default_factory=list)
    first_mismatch: Mismatch | None = None

    @property
    def lossless(self) -> bool:
        return self.first_mismatch is None


@dataclass(frozen=True)
class OutputCheck:
    """One method's output on one prompt: the token check, and where it first departs from
    ``ar``'s output (information only: after a near-tie two lossless outputs may differ)."""

    suite: str
    prompt_index: int
    method: str  # the variant's unique name
    engine: RunnerKind
    check: TokenCheck
    departs_from_ar: int | None

    def to_dict(self) -> dict[str, Any]:
        c = self.check
        return {
            "suite": self.suite, "prompt_index": self.prompt_index, "method": self.method,
            "engine": self.engine, "positions": c.positions, "near_ties": list(c.near_ties),
            "lossless": c.lossless, "departs_from_ar": self.departs_from_ar,
            "first_mismatch": dataclasses.asdict(c.first_mismatch) if c.first_mismatch else None,
        }


def first_divergence(ar_ids: Sequence[int], got_ids: Sequence[int]) -> int | None:
    """First position where the outputs differ (a length difference counts); None if equal."""
    for i, (a, b) in enumerate(zip(ar_ids, got_ids)):
        if a != b:
            return i
    return None if len(ar_ids) == len(got_ids) else min(len(ar_ids), len(got_ids))


class TieJudge:
    """Checks outputs token by token against the target; ``abs_tol`` is the near-tie
    tolerance's absolute floor (``tie_tolerance`` adds the run dtype's rounding steps).

    A model loaded in a half dtype is upcast to float32 on a private copy, built on first use. A
    packed target (``--target-weights``) is judged as it is: its packed layers keep their own
    precision whatever the rest runs in, so an upcast copy would be a third model, neither the
    target nor float32 (on the embedded pair it disagrees with the int8 target by up to 0.6 logits).
    """

    def __init__(self, target: LoadedModel, abs_tol: float, upcast: bool = True) -> None:
        self.target = target
        self.abs_tol = abs_tol
        self.upcast = upcast and target.dtype != torch.float32 and not is_packed(target.model)
        self._model: PreTrainedModel | None = None
        self.fallback = ""  # why the judge ran in the run's own dtype after all (recorded in the report)

    @property
    def precision(self) -> str:
        """What the judge's logits are computed in: float32, the packed target as it is, or the
        run's own dtype where the float32 copy could not be made (then ``fallback`` says why)."""
        if is_packed(self.target.model):
            return "the packed target as loaded"
        if self.target.dtype == torch.float32 or (self.upcast and not self.fallback):
            return "float32"
        return str(self.target.dtype).removeprefix("torch.") + (f" (float32 copy failed: {self.fallback})"
                                                                 if self.fallback else "")

    def check(
        self, prompt_ids: list[int], output_ids: list[int], max_new_tokens: int | None = None,
        eos: Collection[int] = (),
    ) -> TokenCheck:
        """Check every token of ``output_ids``. With ``max_new_tokens``, an output that ends
        before it without an EOS token (one of ``eos``) stopped early, and one that goes on
        after an EOS token went on too long."""
        if not output_ids:
            stopped = max_new_tokens is not None and max_new_tokens > 0
            return TokenCheck(0, [], Mismatch(0, "stopped early", None, None, None, None, None) if stopped else None)
        logits = self.output_logits(prompt_ids, output_ids)  # (n, V)
        top2 = logits.topk(2, dim=-1)  # values, indices: (n, 2)
        chosen = logits.gather(1, torch.tensor(output_ids).unsqueeze(1)).squeeze(1)  # (n,)
        near_ties: list[int] = []
        for i, token in enumerate(output_ids):
            best, best_token = top2.values[i, 0].item(), int(top2.indices[i, 0])
            if token == best_token:
                continue
            gap, tol = best - chosen[i].item(), tie_tolerance(self.abs_tol, self.target.dtype, best)
            if gap > tol:
                mismatch = Mismatch(i, "not the target's choice", token, best_token, gap,
                                    best - top2.values[i, 1].item(), tol)
                return TokenCheck(len(output_ids), near_ties, mismatch)
            near_ties.append(i)
        return TokenCheck(len(output_ids), near_ties, self._stop_mismatch(output_ids, max_new_tokens, set(eos)))

    @staticmethod
    def _stop_mismatch(output_ids: list[int], max_new_tokens: int | None, eos: set[int]) -> Mismatch | None:
        early_eos = next((i for i, t in enumerate(output_ids[:-1]) if t in eos), None)
        if early_eos is not None:
            return Mismatch(early_eos + 1, "went on after EOS", output_ids[early_eos + 1], None, None, None, None)
        n = len(output_ids)
        if max_new_tokens is not None and n < max_new_tokens and output_ids[-1] not in eos:
            return Mismatch(n, "stopped early", None, None, None, None, None)
        return None

    @torch.inference_mode()
    def output_logits(self, prompt_ids: list[int], output_ids: list[int]) -> torch.Tensor:
        """(n, V) float32: the target's logits for each of the n output positions, each given the
        prompt and the output before it (one teacher-forced forward)."""
        model = self._judge_model()
        ids = torch.tensor([prompt_ids + output_ids[:-1]], device=model.device)  # (1, P + n - 1)
        return model(input_ids=ids, logits_to_keep=len(output_ids)).logits[0].float().cpu()

    def _judge_model(self) -> PreTrainedModel:
        if not self.upcast:
            return self.target.model
        if self._model is None:
            try:
                self._model = copy.deepcopy(self.target.model).float()
                logger.info("lossless checks: target upcast to float32")
            except (RuntimeError, MemoryError) as err:
                logger.warning("lossless checks in %s (float32 copy failed: %s)", self.target.dtype, err)
                self.upcast, self.fallback = False, str(err)[:200]
                return self.target.model
        return self._model

    def release(self) -> None:
        self._model = None
