"""Who adapts better, the tree's confidence or the acceptance history? On one atlas, TALON's gate
(confidence: it grows the tree while the draft is sure) against the engines' history rules
(transformers' +2/−1 heuristic, SGLang's EMA of accepted lengths), each step measured against
the oracle: how many tokens of the draft's own chain the target would have accepted there.

* **Shortfall**: acceptable tokens a rule did not draft (it was allowed too few). A history rule
  shrinks after misses, so where the text turns easy (a copied span, boilerplate) it lags for
  several steps before it grows back: the **lag** counts those steps.
* **Waste**: drafted tokens the target rejected. Confidence misleads where the draft is sure and
  wrong: the **confident misses** are rejected nodes the draft gave q >= ``CONFIDENT``.

Everything is a replay of the atlas (no model), at the rules' defaults and TALON's at N.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from talon.atlas.adaptive import LengthRule, SglangAdaptive, oracle, replay_lengths
from talon.atlas.adaptive_hf import HfAssisted
from talon.atlas.data import Atlas
from talon.atlas.replay import replay
from talon.atlas.result import for_slot
from talon.run_config import RunConfig, TreeConfig

CONFIDENT = 0.8  # a rejected node the draft gave at least this q: a confident miss


@dataclass(frozen=True)
class RuleTrack:
    """One rule's steps on the atlas: where each began, what it drafted and kept, the oracle."""

    name: str
    p: list[int]
    drafted: list[int]  # TALON: the tree's deepest node
    accepted: list[int]
    oracle: list[int]
    tokens: int
    tokens_per_s: float
    confident_misses: int = 0

    @property
    def shortfall(self) -> int:
        return sum(o - a for o, a, d in zip(self.oracle, self.accepted, self.drafted) if d < o and a < o)

    @property
    def waste(self) -> int:
        return sum(max(d - a, 0) for d, a in zip(self.drafted, self.accepted))

    @property
    def mat(self) -> float:
        return self.tokens / len(self.p) if self.p else 0.0

    def lag(self) -> tuple[int, int]:
        """The longest run of consecutive steps drafting fewer tokens than the oracle, and where it began."""
        best, start, run, run_start = 0, 0, 0, 0
        for p, d, o in zip(self.p, self.drafted, self.oracle):
            if d < o:
                run_start = p if run == 0 else run_start
                run += 1
                if run > best:
                    best, start = run, run_start
            else:
                run = 0
        return best, start


@dataclass(frozen=True)
class LengthLesson:
    prompt: str
    budget: int
    tracks: list[RuleTrack]  # TALON first
    confident: float = CONFIDENT  # the q from which a rejected node is a confident miss


def _chain_track(atlas: Atlas, rule: LengthRule, name: str) -> RuleTrack:
    run = replay_lengths(atlas, rule)
    steps = run.steps
    return RuleTrack(name, [s.p for s in steps], [s.drafted for s in steps], [s.accepted for s in steps],
                     [s.oracle for s in steps], run.tokens,
                     run.tokens / run.predicted_s if run.predicted_s > 0 else 0.0)


def talon_track(atlas: Atlas, budget: int) -> RuleTrack:
    """TALON's gate over the draft alone at N = ``budget``; its oracle is the chain's at each step's root."""
    cfg = for_slot(atlas, RunConfig(drafter="model", max_new_tokens=len(atlas.output), cost_model="fixed",
                                    tree=TreeConfig(budget=budget, cost_aware=False),
                                    draft_vocab=int(atlas.models.get("draft_vocab", RunConfig.draft_vocab))))
    result = replay(atlas, cfg)
    p, drafted, accepted, orc, confident = [], [], [], [], 0
    at = 1
    for step in result.steps:
        kept = set(step.accepted)
        p.append(at)
        drafted.append(max(step.depths, default=0))
        accepted.append(len(step.accepted) - 1)
        orc.append(oracle(atlas, at))
        confident += sum(1 for n in range(1, len(step.tokens))
                         if n not in kept and step.parents[n] in kept and step.q_draft[n] >= CONFIDENT)
        at += len(step.new_tokens)
    return RuleTrack("TALON's gate", p, drafted, accepted, orc, len(result.summary.token_ids), result.tokens_per_s,
                     confident)


def length_lesson(atlas: Atlas, budget: int = 16) -> LengthLesson:
    """TALON's gate, transformers' heuristic and SGLang's adaptive steps on ``atlas`` (each rule
    fresh, at its defaults, as a server's first request)."""
    tracks = [talon_track(atlas, budget),
              _chain_track(atlas, HfAssisted("heuristic"), "transformers' heuristic"),
              _chain_track(atlas, SglangAdaptive(), "SGLang's adaptive steps")]
    return LengthLesson(atlas.prompt, budget, tracks)


def lesson_totals(atlases: Sequence[Atlas], budget: int = 16) -> dict[str, tuple[int, int, float]]:
    """Per rule over ``atlases``: (shortfall, waste, tokens a step)."""
    totals: dict[str, list[float]] = {}
    for atlas in atlases:
        for t in length_lesson(atlas, budget).tracks:
            acc = totals.setdefault(t.name, [0, 0, 0, 0])
            acc[0] += t.shortfall
            acc[1] += t.waste
            acc[2] += t.tokens
            acc[3] += len(t.p)
    return {name: (int(v[0]), int(v[1]), v[2] / v[3] if v[3] else 0.0) for name, v in totals.items()}
