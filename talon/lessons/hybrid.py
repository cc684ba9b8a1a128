"""Why hybrid? The Talon paper's claim, replayed exactly on atlases: retrieval wins where text is
copied (summaries, code that repeats the prompt), the draft model where it is not, and the hybrid
takes each where it is strong. Per atlas, MAT and predicted tokens/s of the draft model alone,
retrieval alone and the hybrid (the app's default configuration otherwise), and for the hybrid,
which source carried each step: the source of its deepest accepted node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from talon.atlas.data import Atlas
from talon.atlas.replay import ReplayResult, replay
from talon.knobs import ATLAS_DRAFTING_KINDS
from talon.run_config import RunConfig
from talon.trace import StepTrace

COMPARED: tuple[str, ...] = tuple(sorted(ATLAS_DRAFTING_KINDS, key=lambda k: k == "hybrid"))  # its halves, then hybrid


@dataclass
class HybridLesson:
    """One atlas: each drafter's MAT and predicted tokens/s, and what carried the hybrid's steps."""

    suite: str
    prompt: str
    mat: dict[str, float]
    tokens_per_s: dict[str, float]
    carried: list[str] = field(default_factory=list)  # per hybrid step: model, retrieval, both or none
    step_tokens: list[list[int]] = field(default_factory=list)  # per hybrid step: the tokens it committed
    step_texts: list[str] = field(default_factory=list)  # per hybrid step: their text
    coverage: float = 1.0

    @property
    def best(self) -> str:
        return max(COMPARED, key=lambda d: self.tokens_per_s[d])


def carrier(step: StepTrace) -> str:
    """Which source the step's accepted path came from: its deepest accepted node's (none: only
    the bonus token)."""
    if len(step.accepted) < 2:
        return "none"
    return step.sources[step.accepted[-1]]


def hybrid_lesson(atlas: Atlas, base: RunConfig | None = None) -> HybridLesson:
    """Replay the three drafters on ``atlas`` (``base``: the rest of the configuration)."""
    base = (base or RunConfig()).replace(max_new_tokens=len(atlas.output), cost_model="fixed",
                                         draft_vocab=int(atlas.models.get("draft_vocab", RunConfig.draft_vocab)))
    runs: dict[str, ReplayResult] = {d: replay(atlas, base.replace(drafter=d)) for d in COMPARED}
    rate = {d: len(r.summary.token_ids) / r.predicted_s if r.predicted_s > 0 else 0.0 for d, r in runs.items()}
    hybrid = runs["hybrid"].steps
    texts = ["".join(atlas.text(t) for t in s.new_tokens if t not in atlas.eos) for s in hybrid]
    return HybridLesson(atlas.suite, atlas.prompt, {d: r.mat for d, r in runs.items()}, rate,
                        [carrier(s) for s in hybrid], [list(s.new_tokens) for s in hybrid], texts,
                        min(r.coverage.share for r in runs.values()))


def carried_shares(lesson: HybridLesson) -> dict[str, float]:
    """Share of the hybrid's committed tokens carried by each source (a step's tokens go to its carrier)."""
    counts: Counter = Counter()
    for who, tokens in zip(lesson.carried, lesson.step_tokens):
        counts[who] += len(tokens)
    total = sum(counts.values()) or 1
    return {k: counts[k] / total for k in ("model", "retrieval", "both", "none")}


def hybrid_table(lessons: Sequence[HybridLesson]) -> str:
    """Markdown: per suite (pooled: tokens / steps is not kept here, so means of per-prompt
    values), MAT and predicted tok/s of each drafter, and where the hybrid's tokens came from."""
    groups: dict[str, list[HybridLesson]] = {}
    for lesson in lessons:
        groups.setdefault(lesson.suite or "?", []).append(lesson)
    if len(groups) > 1:
        groups["all"] = list(lessons)
    head = ("| suite | prompts | MAT model / retrieval / hybrid | tok/s (pred.) model / retrieval / hybrid "
            "| hybrid's tokens by carrier: model / retrieval / both / bonus only | best per prompt |")
    lines = [head, "| --- | ---: | --- | --- | --- | --- |"]
    for suite, group in groups.items():
        n = len(group)
        mat = " / ".join(f"{sum(g.mat[d] for g in group) / n:.2f}" for d in COMPARED)
        rate = " / ".join(f"{sum(g.tokens_per_s[d] for g in group) / n:.2f}" for d in COMPARED)
        shares = [carried_shares(g) for g in group]
        carried = " / ".join(f"{100 * sum(s[k] for s in shares) / n:.0f} %"
                             for k in ("model", "retrieval", "both", "none"))
        best = ", ".join(g.best for g in group)
        lines.append(f"| {suite} | {n} | {mat} | {rate} | {carried} | {best} |")
    return "\n".join(lines)
