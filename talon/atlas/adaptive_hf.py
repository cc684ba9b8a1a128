"""transformers' adaptive assisted generation as a length rule (``talon.atlas.adaptive``): its
``num_assistant_tokens_schedule`` and its dynamic ``assistant_confidence_threshold``, with the
threshold's ROC update reproduced from scikit-learn (:func:`roc_threshold`). Proven against the
library itself on the embedded pair: ``scripts/hf_adaptive_check.py``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from talon.atlas.adaptive import ORACLE_DEPTH, LengthRule
from talon.atlas.serving_replay import check_int
from talon.run_config import ConfigError

HF_VERSION = "transformers 5.23.0 (generation/candidate_generator.py, AssistedCandidateGenerator)"


@dataclass
class HfAssisted(LengthRule):
    """transformers' assisted generation with an assistant model, greedy (``HF_VERSION``):

    * ``num_assistant_tokens`` (20 by default) caps the chain; ``schedule`` ``heuristic``: +2 after a
      step whose drafts were all accepted, else −1 (at least 1), kept from request to request (it is
      written back to the assistant's generation config); ``heuristic_transient``: the same, reset
      every request; ``constant``: never moved. A step with no room to draft counts as all accepted.
    * ``confidence`` (``assistant_confidence_threshold``, 0.4 by default; 0 turns it off): the chain
      stops after a drafted token whose q is below it (``ConfidenceCriteria``), and after an
      end-of-sequence token. After each step the threshold moves: the drafted tokens' q with 1 for
      each accepted one and 0 for the first rejected (the rest dropped) are kept; with more than
      five kept and both labels present, the threshold becomes the one on their ROC curve that
      minimises ``fpr + 3 fnr`` (scikit-learn's ``roc_curve``, reproduced by :func:`roc_threshold`).
      The kept list and the moved threshold last one request (the candidate generator is built
      anew by each ``generate`` call; its documentation says the threshold persists, its code does not).
    * The first step drafts from the prompt, before the target's first token.
    """

    schedule: str = "heuristic"
    num_assistant_tokens: int = 20
    confidence: float = 0.4
    drafts_first_token = True
    tokens: int = field(init=False, default=0)
    current: float = field(init=False, default=0.0)
    probs: list[float] = field(init=False, default_factory=list)
    matches: list[int] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.schedule not in HF_SCHEDULES:
            raise ConfigError(f"schedule must be one of {', '.join(HF_SCHEDULES)}, got {self.schedule!r}")
        check_int("num_assistant_tokens", self.num_assistant_tokens, 1, ORACLE_DEPTH)
        if isinstance(self.confidence, bool) or not 0 <= self.confidence < 1:
            raise ConfigError(f"confidence must be in [0, 1), got {self.confidence!r}")
        self.tokens = self.num_assistant_tokens

    @property
    def name(self) -> str:  # type: ignore[override]
        return {"heuristic": "hf-heuristic", "heuristic_transient": "hf-heuristic-transient",
                "constant": "hf-confidence"}[self.schedule]

    def knobs(self) -> dict[str, Any]:
        return {"num_assistant_tokens": self.num_assistant_tokens, "confidence": self.confidence}

    def start(self) -> None:
        if self.schedule != "heuristic":
            self.tokens = self.num_assistant_tokens
        self.current, self.probs, self.matches = self.confidence, [], []

    def length(self) -> int:
        return self.tokens

    def threshold(self) -> float | None:
        return self.current if self.current > 0 else None

    def stop_after(self, q: float) -> bool:
        return self.current > 0 and q < self.current

    def learn(self, drafted: int, accepted: int, probs: list[float]) -> None:
        if self.schedule != "constant":
            self.tokens = self.tokens + 2 if accepted == drafted else max(1, self.tokens - 1)
        if self.confidence > 0:
            self.probs += probs
            self.matches += [1] * accepted
            if len(self.probs) > len(self.matches):
                self.matches.append(0)
            del self.probs[len(self.matches):]
            if len(self.probs) > 5 and {0, 1} <= set(self.matches):
                self.current = roc_threshold(self.matches, self.probs)


HF_SCHEDULES = ("heuristic", "heuristic_transient", "constant")


def roc_threshold(matches: Sequence[int], probs: Sequence[float]) -> float:
    """The threshold transformers picks: on scikit-learn's ROC curve of ``probs`` against
    ``matches`` (``roc_curve``, ``drop_intermediate=True``, +inf first), the first that minimises
    ``fpr + 3 (1 - tpr)``."""
    y = np.asarray(matches, dtype=np.float64)
    s = np.asarray(probs, dtype=np.float64)
    order = np.argsort(s, kind="mergesort")[::-1]
    s, y = s[order], y[order]
    idx = np.r_[np.where(np.diff(s))[0], y.size - 1]
    tps = np.cumsum(y)[idx]
    fps = 1 + idx - tps
    thresholds = s[idx]
    if len(fps) > 2:
        keep = np.where(np.r_[True, np.logical_or(np.diff(fps, 2), np.diff(tps, 2)), True])[0]
        fps, tps, thresholds = fps[keep], tps[keep], thresholds[keep]
    tps, fps = np.r_[0.0, tps], np.r_[0.0, fps]
    thresholds = np.r_[np.inf, thresholds]
    cost = fps / fps[-1] + 3 * (1 - tps / tps[-1])
    return float(thresholds[int(np.argmin(cost))])


