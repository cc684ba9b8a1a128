"""Exercises: a question about what one knob will do on one lesson prompt, answered by replaying
it (``talon.atlas.loop``) with the knob moved, so the data, not the text, decides the answer:

* **The gate**: raise μ from its default to 0.5: do the adaptive trees grow deeper or wider?
* **The budget**: give the adaptive tree EAGLE-3's N = 59 instead of 16: how much more does a
  step accept?
* **Retrieval**: add retrieval to the draft model (the hybrid): does a step accept more?

Each answer carries the figures that decide it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from talon.atlas.data import Atlas
from talon.atlas.replay import replay
from talon.atlas.result import ReplayResult
from talon.lessons.adaptive import AdaptiveLesson, adaptive_config
from talon.lessons.hybrid import HybridLesson

HIGH_MU = 0.5
SHIFT = 0.25  # a mean depth or widest layer that moves less than this is "about the same"
SAME = 0.05  # MATs within this share of each other are "about the same"


@dataclass(frozen=True)
class Exercise:
    question: str
    choices: tuple[str, ...]
    right: int  # the index of the answer the replay gives
    answer: str  # why, with the figures


@dataclass(frozen=True)
class Shape:
    depth: float  # mean deepest layer of the drafted trees
    width: float  # mean widest layer
    nodes: float  # mean drafted nodes
    mat: float


def shape_of(result: ReplayResult) -> Shape:
    trees = [s for s in result.steps if len(s.tokens) > 1] or result.steps
    n = max(len(trees), 1)
    widest = [max((s.depths[1:].count(d) for d in set(s.depths[1:])), default=0) for s in trees]
    return Shape(sum(max(s.depths) for s in trees) / n, sum(widest) / n, sum(len(s.tokens) - 1 for s in trees) / n,
                 result.mat)


def mu_exercise(atlas: Atlas, budget: int) -> Exercise:
    base = adaptive_config(atlas, budget)
    low = shape_of(replay(atlas, base))
    high = shape_of(replay(atlas, base.replace(tree=dataclasses.replace(base.tree, mu=HIGH_MU))))
    deeper, wider = high.depth - low.depth, high.width - low.width
    right = 0 if deeper >= SHIFT and wider <= 0 else 1 if wider >= SHIFT and deeper <= 0 else 2
    return Exercise(
        f"Raise the gate μ from {base.tree.mu:g} to {HIGH_MU:g} (N = {budget}): do the trees grow deeper or wider?",
        ("Deeper (and narrower)", "Wider (and shallower)", "Neither clearly"), right,
        f"On this prompt the mean deepest layer goes from {low.depth:.1f} to {high.depth:.1f}, the mean widest "
        f"layer from {low.width:.1f} to {high.width:.1f} nodes, the nodes per tree from {low.nodes:.1f} to "
        f"{high.nodes:.1f}, MAT from {low.mat:.2f} to {high.mat:.2f}. " + WHY_MU[right])


WHY_MU = (
    "A higher μ lets fewer nodes of each layer expand, so the budget goes down the likeliest paths instead of "
    "their rivals.",
    "A higher μ cuts the deep layers' doubtful nodes, and the budget they freed goes to the root's layer, which "
    "the gate does not touch.",
    "The gate rarely binds here: the nodes that win the budget clear μ times their layer's best either way.",
)


def budget_exercise(small: AdaptiveLesson, large: AdaptiveLesson) -> Exercise:
    gain = large.adaptive_mat / small.adaptive_mat - 1
    right = 0 if gain < 0.10 else 1 if gain < 0.30 else 2
    rate = (f" Predicted speed on the recording host: {small.adaptive_rate:.1f} against {large.adaptive_rate:.1f} "
            "tokens/s, since checking more nodes costs more there." if small.adaptive_rate and large.adaptive_rate
            else "")
    return Exercise(
        f"Give the adaptive tree N = {large.budget} nodes instead of {small.budget}: how much more does a step "
        "accept (MAT)?", ("Under 10 % more", "10 to 30 % more", "Over 30 % more"), right,
        f"MAT goes from {small.adaptive_mat:.2f} to {large.adaptive_mat:.2f} ({100 * gain:+.0f} %): the extra "
        f"nodes are the less likely ones, so each adds less than the last.{rate}")


def retrieval_exercise(lesson: HybridLesson) -> Exercise:
    alone, hybrid = lesson.mat["model"], lesson.mat["hybrid"]
    change = hybrid / alone - 1
    right = 0 if change > SAME else 2 if change < -SAME else 1
    return Exercise(
        "Add retrieval to the draft model (the hybrid): does a step accept more?",
        ("Yes, over 5 % more", "About the same (within 5 %)", "No, less"), right,
        f"MAT goes from {alone:.2f} (draft model alone) to {hybrid:.2f} (hybrid), {100 * change:+.0f} %. Retrieval "
        "helps where the text repeats what came before (a summary quoting its article, code reusing names); "
        "elsewhere its grafts take budget the draft model's guesses would have used.")


def exercises(atlas: Atlas, small: AdaptiveLesson, large: AdaptiveLesson, hybrid: HybridLesson) -> list[Exercise]:
    """The three exercises on ``atlas`` (its adaptive lessons at two budgets and its hybrid lesson)."""
    return [mu_exercise(atlas, small.budget), budget_exercise(small, large), retrieval_exercise(hybrid)]
