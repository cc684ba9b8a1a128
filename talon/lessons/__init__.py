"""Lessons: the papers' claims shown with evidence, replayed exactly on draft atlases (no model).

``adaptive`` (TALON: the static depth dilemma, the acceptance funnel, the adaptive tree against
EAGLE-3's default static tree and the best fixed depth), ``hybrid`` (Talon, AAAI: where retrieval
and the draft model each carry the steps). The app ships lesson atlases of a few prompts of every
Spec-Bench suite (``data/lessons``, recorded by ``scripts/record_lessons.py``), so every lesson
works before a model loads.
"""

from __future__ import annotations

from pathlib import Path

from talon.atlas.data import Atlas, load_atlases
from talon.lessons.adaptive import lesson_trees
from talon.lessons.hybrid import COMPARED
from talon.run_config import RunConfig
from talon.specbench import SPECBENCH_SUITES

LESSONS_DIR = Path(__file__).resolve().parents[2] / "data" / "lessons"


def bundled_atlases() -> list[Atlas]:
    """The shipped lesson atlases, suite by suite in Spec-Bench's order."""
    order = {suite: i for i, suite in enumerate(SPECBENCH_SUITES)}
    return sorted(load_atlases([LESSONS_DIR]), key=lambda a: order.get(a.suite, len(order)))


def lesson_configs(base: RunConfig) -> list[RunConfig]:
    """Every configuration the lessons replay on an atlas recorded with ``base`` (what
    ``record_atlas(..., cover=...)`` makes the lesson atlases hold exactly)."""
    rest = base.replace(cost_model="fixed")
    return [*lesson_trees(base.max_new_tokens, base.draft_vocab), *(rest.replace(drafter=d) for d in COMPARED)]
