"""transformers' adaptive assisted generation, counted for real on the embedded pair
(``scripts/hf_adaptive_check.py`` wrote ``data/hf_adaptive``), equals Talon's replay of its rules
on atlases of the same prompts, step by step; and each planted change of a rule breaks that."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from talon.atlas.adaptive import replay_requests
from talon.atlas.adaptive_hf import HfAssisted
from talon.atlas.data import Atlas, load_atlases

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "hf_adaptive"
REQUESTS = 12  # two prompts of each of Spec-Bench's six suites
SCHEDULES = ("heuristic", "heuristic_transient", "constant")


@pytest.fixture(scope="module")
def fixture() -> tuple[dict, list[Atlas]]:
    counts = json.loads((FIXTURE / "counts.json").read_text(encoding="utf-8"))
    return counts, load_atlases([FIXTURE / name for name in counts["atlases"]])


def replayed(atlases: list[Atlas], rule: HfAssisted, limit: int) -> list[list[tuple[int, int]]]:
    return [[(s.drafted, s.accepted) for s in run.steps] for run in replay_requests(atlases, rule, limit)]


def agreeing(counts: dict, atlases: list[Atlas], schedule: str, rule: HfAssisted) -> int:
    """Requests whose transformers counters equal the replay's, step for step."""
    hf = counts["schedules"][schedule]
    mine = replayed(atlases, rule, counts["max_new_tokens"])
    return sum(h["output"] == a.output and [tuple(s) for s in h["steps"]] == m for h, a, m in zip(hf, atlases, mine))


def test_the_fixture_is_every_request_with_drafts_accepted(fixture) -> None:  # noqa: ANN001
    counts, atlases = fixture
    assert len(atlases) == REQUESTS and {a.suite for a in atlases} >= {"mt_bench", "humaneval", "gsm8k", "alpaca",
                                                                     "sum", "qa"}
    assert counts["transformers"] == "5.23.0" and counts["dtype"] == "float32"
    for schedule in SCHEDULES:
        hf = counts["schedules"][schedule]
        assert len(hf) == REQUESTS
        assert all(h["output"] == a.output for h, a in zip(hf, atlases))  # every text equals the atlas's
        assert sum(acc for h in hf for _, acc in h["steps"]) > 100  # drafts were accepted


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_transformers_counters_equal_the_replay(fixture, schedule: str) -> None:  # noqa: ANN001
    counts, atlases = fixture
    assert agreeing(counts, atlases, schedule, HfAssisted(schedule)) == REQUESTS


@dataclass
class SwappedSteps(HfAssisted):
    """Planted: −1 after a fully accepted draft, +2 otherwise."""

    def learn(self, drafted: int, accepted: int, probs: list[float]) -> None:
        before = self.tokens
        super().learn(drafted, accepted, probs)
        if self.schedule != "constant":
            self.tokens = max(1, before - 1) if accepted == drafted else before + 2


@dataclass
class FrozenThreshold(HfAssisted):
    """Planted: the confidence threshold never moves."""

    def learn(self, drafted: int, accepted: int, probs: list[float]) -> None:
        super().learn(drafted, accepted, probs)
        self.current = self.confidence


@dataclass
class ResetEachCall(HfAssisted):
    """Planted: ``heuristic`` forgets its length between requests (as ``heuristic_transient`` does)."""

    def start(self) -> None:
        super().start()
        self.tokens = self.num_assistant_tokens


@pytest.mark.parametrize("plant,schedule", [(SwappedSteps, "heuristic"), (SwappedSteps, "heuristic_transient"),
                                            (FrozenThreshold, "constant"), (FrozenThreshold, "heuristic"),
                                            (ResetEachCall, "heuristic")])
def test_each_planted_rule_disagrees_with_transformers(fixture, plant: type, schedule: str) -> None:  # noqa: ANN001
    counts, atlases = fixture
    assert agreeing(counts, atlases, schedule, plant(schedule)) < REQUESTS
