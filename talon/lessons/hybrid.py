"""Why hybrid? The Talon paper's claim, replayed exactly on atlases: retrieval wins where text is
copied (summaries, code that repeats the prompt), the draft model where it is not, and the hybrid
takes each where it is strong. Per atlas, MAT and predicted tokens/s of the draft model alone,
retrieval alone and the hybrid (the app's default configuration otherwise), and for the hybrid,
which source carried each step: the source of its deepest accepted node. ``retrieval_example``
finds, on the step retrieval carried furthest, the match retrieval drafted from: the end of the
text so far, where it occurred before, and what followed it there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from talon.atlas.data import Atlas
from talon.atlas.replay import replay
from talon.atlas.result import ReplayResult, for_slot
from talon.drafters.suffix import SuffixIndex
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
    slot: str = "draft model"  # what drafted in the draft slot: "draft model" or "EAGLE-3 head" ("model" above)

    @property
    def best(self) -> str:
        return max(COMPARED, key=lambda d: self.tokens_per_s[d])


def carrier(step: StepTrace) -> str:
    """Which source the step's accepted path came from: its deepest accepted node's (none: only
    the bonus token)."""
    if len(step.accepted) < 2:
        return "none"
    source = step.sources[step.accepted[-1]]
    return "model" if source == "head" else source  # the draft slot's, a draft model's or a head's


def hybrid_lesson(atlas: Atlas, base: RunConfig | None = None) -> HybridLesson:
    """Replay the three drafters on ``atlas`` (``base``: the rest of the configuration); on an
    EAGLE-3 head's atlas "model" and "hybrid" are the head's kinds (``for_slot``)."""
    base = (base or RunConfig()).replace(max_new_tokens=len(atlas.output), cost_model="fixed",
                                         draft_vocab=int(atlas.models.get("draft_vocab", RunConfig.draft_vocab)))
    runs: dict[str, ReplayResult] = {d: replay(atlas, for_slot(atlas, base.replace(drafter=d))) for d in COMPARED}
    rate = {d: r.tokens_per_s for d, r in runs.items()}
    hybrid = runs["hybrid"].steps
    texts = ["".join(atlas.text(t) for t in s.new_tokens if t not in atlas.eos) for s in hybrid]
    return HybridLesson(atlas.suite, atlas.prompt, {d: r.mat for d, r in runs.items()}, rate,
                        [carrier(s) for s in hybrid], [list(s.new_tokens) for s in hybrid], texts,
                        min(r.coverage.share for r in runs.values()),
                        "EAGLE-3 head" if atlas.draft_kind == "head" else "draft model")


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


@dataclass(frozen=True)
class RetrievalExample:
    """Retrieval at work on one step: the text's last ``len(match)`` tokens occurred before, at
    ``earlier``; what followed them there is the draft (``proposed``, of which ``kept`` tokens the
    target accepted on that step)."""

    step: int
    before: list[int]  # a few tokens before the earlier occurrence
    match: list[int]
    proposed: list[int]
    kept: int
    earlier: int  # token position (prompt included) where the earlier occurrence ends
    now_before: list[int]  # a few tokens before the match at the end of the text


def retrieval_example(atlas: Atlas, lesson: HybridLesson, context: int = 12, shown: int = 8) -> RetrievalExample | None:
    """The hybrid step retrieval carried furthest, and the match it drafted from (None: retrieval
    carried no step on this prompt)."""
    carried = [i for i, who in enumerate(lesson.carried) if who in ("retrieval", "both")]
    if not carried:
        return None
    step = max(carried, key=lambda i: (len(lesson.step_tokens[i]), -i))
    start = sum(len(t) for t in lesson.step_tokens[:step])
    text = list(atlas.prompt_ids) + list(atlas.output[:start])
    index = SuffixIndex()
    index.extend(text)
    found = index.longest_match()
    if not found.ends or found.length == 0:
        return None
    end, n = found.ends[0], min(found.length, shown)
    proposed = index.continuation(end, shown)
    done = lesson.step_tokens[step]
    agree = next((k for k, (a, b) in enumerate(zip(proposed, done)) if a != b), min(len(proposed), len(done)))
    kept = min(agree, len(done) - 1)  # the last committed token is the target's own
    return RetrievalExample(step, text[max(0, end - n - context + 1):end - n + 1], text[end - n + 1:end + 1],
                            proposed, kept, end, text[max(0, len(text) - n - context):len(text) - n])
