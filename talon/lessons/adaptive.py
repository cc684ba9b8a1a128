"""Why adaptive? TALON's claim, replayed exactly on atlases: the static depth dilemma, the
acceptance funnel, and the adaptive tree against EAGLE-3's default static tree and against the
best fixed depth chosen with hindsight, all at equal budgets. No model: every number is a replay
(``talon.atlas.loop``) of the draft model's own proposals.

* **Static trees over depths**: EAGLE-2/3's static tree (``tree=static``: the root's K children,
  then the k best of each layer expand k children each, the best N kept by path confidence) at
  depths 1..8, so the best depth per prompt and how far each fixed depth falls from it show.
* **EAGLE-3's default shape**, read from ``SafeAILab/EAGLE`` ``eagle/model/ea_model.py``
  (``EaModel.from_pretrained``: ``total_token=60, depth=7, top_k=10``) and ``eagle/model/cnets.py``
  (``total_tokens - 1`` = 59 draft nodes; ``depth`` expansions after the root's layer, so 8
  layers): K = k = 10, depth 8, N = 59, ranked by path confidence.
* **TALON's adaptive tree** at the same N: the root's K children ungated, then confidence-gated
  layers (mu) of k children each, filled best first until N; no cost planning, no confidence stop,
  ranked by path confidence, so shape is set against shape.
* **The funnel**: of the nodes the adaptive tree drafted and the target accepted, the share by
  sibling rank (1 = the most probable child) and by depth.
* **Calibration**: the adaptive tree's drafted nodes binned by path confidence (tenths), with the
  share the target accepted: where that share follows the confidence, gating on it spends the
  budget where acceptance is likely (EAGLE-2's observation, on these prompts).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from talon.atlas.data import Atlas
from talon.atlas.replay import replay
from talon.atlas.result import ReplayResult, for_slot
from talon.run_config import RunConfig, TreeConfig

EAGLE3_SHAPE = {"root_k": 10, "top_k": 10, "max_depth": 8, "budget": 59}
EAGLE3_SOURCE = ("SafeAILab/EAGLE eagle/model/ea_model.py (EaModel.from_pretrained: total_token=60, depth=7, "
                 "top_k=10) and eagle/model/cnets.py (total_tokens - 1 draft nodes; depth expansions after the "
                 "root's layer), commit cb7e084")
DEPTHS = tuple(range(1, 9))
ADAPTIVE_K = 4  # TALON's gated layers propose a few children per node (the root's layer keeps K = 10)


BUDGETS = (16, 59)  # Talon's default N, and EAGLE-3's


def static_config(atlas: Atlas, depth: int, budget: int) -> RunConfig:
    """EAGLE's static tree at ``depth`` layers with EAGLE-3's K = k = 10 (or as wide as an atlas
    recorded narrower holds), N = ``budget``."""
    k = widths(atlas)
    return for_slot(atlas, _static(depth, budget, len(atlas.output), _vocab(atlas), *k))


def adaptive_config(atlas: Atlas, budget: int) -> RunConfig:
    """TALON's adaptive tree at N = ``budget``: K = 10 ungated at the root, gated layers of k."""
    root_k, top_k = widths(atlas)
    return for_slot(atlas, _adaptive(budget, len(atlas.output), _vocab(atlas), root_k, min(ADAPTIVE_K, top_k)))


def widths(atlas: Atlas) -> tuple[int, int]:
    """EAGLE-3's K and k, cut to what ``atlas`` recorded (an explorer atlas holds K <= 8, k <= 4)."""
    return min(EAGLE3_SHAPE["root_k"], atlas.spec.root_k), min(EAGLE3_SHAPE["top_k"], atlas.spec.top_k)


def lesson_trees(tokens: int, draft_vocab: int) -> list[RunConfig]:
    """Every tree this lesson replays, for ``tokens`` of text (the lesson atlases cover them)."""
    return [*(_static(d, n, tokens, draft_vocab) for d in DEPTHS for n in BUDGETS),
            *(_adaptive(n, tokens, draft_vocab) for n in BUDGETS)]


def _static(depth: int, budget: int, tokens: int, draft_vocab: int, root_k: int = 10, top_k: int = 10) -> RunConfig:
    tree = TreeConfig(mode="static", budget=budget, root_k=root_k, top_k=top_k, max_depth=depth, min_conf=0.0,
                      cost_aware=False, admission="confidence")
    return _model_only(tree, tokens, draft_vocab)


def _adaptive(budget: int, tokens: int, draft_vocab: int, root_k: int = 10, top_k: int = ADAPTIVE_K) -> RunConfig:
    tree = TreeConfig(mode="adaptive", budget=budget, root_k=root_k, top_k=top_k, max_depth=8, min_conf=0.0,
                      cost_aware=False, admission="confidence")
    return _model_only(tree, tokens, draft_vocab)


def _vocab(atlas: Atlas) -> int:
    return int(atlas.models.get("draft_vocab", RunConfig.draft_vocab))


def _model_only(tree: TreeConfig, tokens: int, draft_vocab: int) -> RunConfig:
    """The draft model alone (an EAGLE-3 head's atlas: the head, ``for_slot``), over the whole
    recorded text, with the draft vocabulary it was recorded with."""
    return RunConfig(drafter="model", tree=tree, max_new_tokens=tokens, cost_model="fixed", draft_vocab=draft_vocab)


@dataclass
class AdaptiveLesson:
    """One atlas: MAT of the static tree per depth, of EAGLE-3's default and of TALON's adaptive
    tree at the same budget, and the adaptive tree's accepted nodes by sibling rank and depth."""

    suite: str
    prompt: str
    budget: int
    static_mat: dict[int, float]  # depth -> MAT
    eagle3_mat: float  # EAGLE-3's shape (K = k = 10, depth 8) at the same budget
    adaptive_mat: float
    funnel_rank: Counter = field(default_factory=Counter)  # sibling rank (1 = top child) -> accepted nodes
    funnel_depth: Counter = field(default_factory=Counter)  # depth -> accepted nodes
    static_rate: dict[int, float] = field(default_factory=dict)  # depth -> tokens/s, predicted by the atlas's costs
    adaptive_rate: float = 0.0  # the same for the adaptive tree
    drafted_by_conf: Counter = field(default_factory=Counter)  # path-confidence tenth (0..9) -> drafted nodes
    accepted_by_conf: Counter = field(default_factory=Counter)  # the same tenth -> of them, accepted
    coverage: float = 1.0  # the least coverage of the replays above
    widths: tuple[int, int] = (EAGLE3_SHAPE["root_k"], EAGLE3_SHAPE["top_k"])  # the static trees' K and k

    @property
    def best_depth(self) -> int:
        return max(self.static_mat, key=lambda d: (self.static_mat[d], -d))

    @property
    def best_static_mat(self) -> float:
        return self.static_mat[self.best_depth]

    @property
    def fastest_depth(self) -> int:
        """The static depth with the most tokens/s: each layer costs one more draft forward."""
        return max(self.static_rate, key=lambda d: (self.static_rate[d], -d))


def sibling_ranks(result: ReplayResult) -> tuple[Counter, Counter]:
    """Accepted drafted nodes by their rank among their siblings (by the draft's q) and depth."""
    ranks: Counter = Counter()
    depths: Counter = Counter()
    for step in result.steps:
        for node in step.accepted[1:]:
            siblings = [n for n in range(1, len(step.tokens)) if step.parents[n] == step.parents[node]]
            rank = 1 + sum(1 for n in siblings if step.q_draft[n] > step.q_draft[node])
            ranks[rank] += 1
            depths[step.depths[node]] += 1
    return ranks, depths


CONF_BINS = 10


def by_confidence(result: ReplayResult) -> tuple[Counter, Counter]:
    """Drafted nodes by path-confidence tenth, and of them the ones the target accepted."""
    drafted: Counter = Counter()
    accepted: Counter = Counter()
    for step in result.steps:
        kept = set(step.accepted)
        for node in range(1, len(step.tokens)):
            tenth = min(CONF_BINS - 1, int(step.path_conf[node] * CONF_BINS))
            drafted[tenth] += 1
            accepted[tenth] += node in kept
    return drafted, accepted


def calibration(lessons: Sequence[AdaptiveLesson]) -> dict[int, tuple[int, int]]:
    """Per path-confidence tenth, pooled over ``lessons``: (accepted, drafted)."""
    drafted: Counter = Counter()
    accepted: Counter = Counter()
    for lesson in lessons:
        drafted.update(lesson.drafted_by_conf)
        accepted.update(lesson.accepted_by_conf)
    return {b: (accepted[b], drafted[b]) for b in sorted(drafted)}


def adaptive_lesson(atlas: Atlas, budget: int = EAGLE3_SHAPE["budget"]) -> AdaptiveLesson:
    """Replay the static depths, EAGLE-3's default and the adaptive tree on ``atlas``."""
    static = {d: replay(atlas, static_config(atlas, d, budget)) for d in DEPTHS}
    eagle3 = static[EAGLE3_SHAPE["max_depth"]]  # EAGLE-3's shape at this budget: its default at N = 59
    adaptive = replay(atlas, adaptive_config(atlas, budget))
    ranks, depths = sibling_ranks(adaptive)
    drafted, accepted = by_confidence(adaptive)
    coverage = min(r.coverage.share for r in [*static.values(), eagle3, adaptive])
    return AdaptiveLesson(atlas.suite, atlas.prompt, budget, {d: r.mat for d, r in static.items()}, eagle3.mat,
                          adaptive.mat, ranks, depths, {d: r.tokens_per_s for d, r in static.items()},
                          adaptive.tokens_per_s, drafted, accepted, coverage, widths(atlas))


@dataclass
class SuiteSummary:
    """The adaptive lesson pooled over one suite's atlases (MAT ratios are means of per-prompt ratios)."""

    suite: str
    prompts: int
    best_depths: list[int]
    adaptive_vs_eagle3: float
    adaptive_vs_hindsight: float
    fixed_depth_shortfall: dict[int, float]  # depth -> mean share of the per-prompt best MAT lost
    coverage: float
    fastest_depths: list[int] = field(default_factory=list)  # per prompt, by predicted tokens/s
    adaptive_vs_fastest: float = 0.0  # tokens/s against each prompt's fastest static depth


def summarize(lessons: Sequence[AdaptiveLesson]) -> list[SuiteSummary]:
    """Per suite, then 'all'."""
    groups: dict[str, list[AdaptiveLesson]] = {}
    for lesson in lessons:
        groups.setdefault(lesson.suite or "?", []).append(lesson)
    if len(groups) > 1:
        groups["all"] = list(lessons)
    out = []
    for suite, group in groups.items():
        n = len(group)
        out.append(SuiteSummary(
            suite, n, [g.best_depth for g in group],
            sum(g.adaptive_mat / g.eagle3_mat for g in group) / n,
            sum(g.adaptive_mat / g.best_static_mat for g in group) / n,
            {d: sum(1 - g.static_mat[d] / g.best_static_mat for g in group) / n for d in DEPTHS},
            min(g.coverage for g in group),
            [g.fastest_depth for g in group if g.static_rate],
            sum(g.adaptive_rate / g.static_rate[g.fastest_depth] for g in group if g.static_rate) / n))
    return out


def funnel(lessons: Sequence[AdaptiveLesson]) -> tuple[dict[int, float], dict[int, float]]:
    """Shares of accepted adaptive nodes by sibling rank and by depth, pooled over ``lessons``."""
    ranks: Counter = Counter()
    depths: Counter = Counter()
    for lesson in lessons:
        ranks.update(lesson.funnel_rank)
        depths.update(lesson.funnel_depth)
    total = sum(ranks.values()) or 1
    return ({r: c / total for r, c in sorted(ranks.items())}, {d: c / total for d, c in sorted(depths.items())})


def adaptive_table(summaries: Sequence[SuiteSummary]) -> str:
    """Markdown: per suite, the best static depth per prompt, what fixed depths lose, and the
    adaptive tree against EAGLE-3's default and against the per-prompt best depth; then the same
    in time: the fastest depth per prompt and the adaptive tree against it (predicted tokens/s)."""
    head = ("| suite | prompts | best static depth per prompt | depth 2 / 4 / 8 lose | adaptive / EAGLE-3's shape "
            "| adaptive / best depth (hindsight) | fastest depth per prompt (tok/s) | adaptive / fastest depth "
            "(tok/s) | coverage |")
    lines = [head, "| --- | ---: | --- | --- | ---: | ---: | --- | ---: | ---: |"]
    for s in summaries:
        lose = " / ".join(f"{100 * s.fixed_depth_shortfall[d]:.0f} %" for d in (2, 4, 8))
        lines.append(f"| {s.suite} | {s.prompts} | {', '.join(map(str, s.best_depths))} | {lose} | "
                     f"{s.adaptive_vs_eagle3:.2f}x | {s.adaptive_vs_hindsight:.2f}x | "
                     f"{', '.join(map(str, s.fastest_depths))} | {s.adaptive_vs_fastest:.2f}x | "
                     f"{100 * s.coverage:.1f} % |")
    return "\n".join(lines)
