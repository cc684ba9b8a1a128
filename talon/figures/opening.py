"""What makes a run a good first view: the lessons each step shows (a branching tree, a gate
that cut a branch, a rejection, a fully accepted path with its bonus, a cost stop, the two
sources side by side), the criterion a bundled opening recording must meet, and the step the
page opens on. ``scripts/record_opening.py`` picks the recording by this criterion and
``tests/test_opening.py`` checks the bundled file against it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from talon.trace import StepTrace

MIN_RICH_STEPS = 3  # steps that branch, gate out a node and reject a draft
RECORDING = Path(__file__).resolve().parents[2] / "static" / "recording.json"  # the first view's trace
# a sampled run of the same pair: the acceptance rule by chance, drawn with no model loaded
SAMPLED_RECORDING = RECORDING.with_name("recording_sampled.json")


@dataclass(frozen=True)
class StepLessons:
    """What one step's trace can teach."""

    branching: bool  # some node has two or more children
    gated: bool  # the confidence gate stopped at least one node
    rejected: bool  # the target turned a drafted token down (its own token replaced it)
    full_path: bool  # the accepted path reached a leaf of depth >= 2, and the bonus followed it
    model: bool  # nodes from the draft model
    retrieval: bool  # nodes from retrieval
    both: bool  # a node proposed by both
    cost_stop: bool  # the cost model stopped the tree

    @property
    def rich(self) -> bool:
        return self.branching and self.gated and self.rejected

    @property
    def two_sources(self) -> bool:
        return (self.model and self.retrieval) or self.both

    @property
    def shows_all(self) -> bool:
        """A branching tree from both sources, a gate that cut, a rejection: the opening step."""
        return self.rich and self.two_sources

    @property
    def score(self) -> int:
        """How much of the idea this step shows at once (rank for the opening step)."""
        return (
            8 * self.shows_all + 3 * self.rich + self.branching + self.gated + self.rejected
            + 2 * self.two_sources + self.both + self.full_path + self.cost_stop
        )


def step_lessons(st: StepTrace) -> StepLessons:
    children = [0] * len(st.tokens)
    for parent in st.parents[1:]:
        children[parent] += 1
    last = st.accepted[-1] if st.accepted else 0
    sources = set(st.sources[1:])
    return StepLessons(
        branching=any(n >= 2 for n in children),
        gated=any(passed is False for passed in st.gate_passed),
        rejected=st.bonus_kind == "resampled",
        full_path=st.bonus_kind == "bonus" and len(st.accepted) >= 3 and children[last] == 0,
        model="model" in sources,
        retrieval="retrieval" in sources,
        both="both" in sources,
        cost_stop=st.tree_stop == "cost",
    )


def opening_criterion(steps: Sequence[StepTrace]) -> dict[str, bool]:
    """Each requirement of a teaching recording, met or not (all must hold). A tree stopped by
    the cost model is not required: where cost-aware planning skips the draft model on most steps
    (a CPU host), the recording is made with planning off, and the cost view still shows where
    each step's expected tokens/s would have peaked."""
    lessons = [step_lessons(st) for st in steps]
    return {
        f"at least {MIN_RICH_STEPS} steps branch, gate out a node and reject a draft":
            sum(x.rich for x in lessons) >= MIN_RICH_STEPS,
        "a step shows it all: a branching tree from both sources, a gate that cut, a rejection":
            any(x.shows_all for x in lessons),
        "a node proposed by both sources": any(x.both for x in lessons),
        "a fully accepted path with its bonus token": any(x.full_path for x in lessons),
    }


def criterion_score(steps: Sequence[StepTrace]) -> tuple[int, int]:
    """(requirements met, rich steps): how close a candidate recording comes (for ranking)."""
    return sum(opening_criterion(steps).values()), sum(step_lessons(st).rich for st in steps)


def opening_step(steps: Sequence[StepTrace]) -> int:
    """The step the page opens on: the one that shows the most at once (the earliest of equals)."""
    if not steps:
        return 0
    scores = [step_lessons(st).score for st in steps]
    return scores.index(max(scores))
