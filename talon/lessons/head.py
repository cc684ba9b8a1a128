"""A head against a draft model: TALON's claims are made on EAGLE-3 heads, Talon's default drafts
with a draft model. Two atlases of one prompt, one recorded with each in the draft slot (the same
target, so the same greedy text), replayed at the same knobs: how many tokens each keeps a step,
alone and with retrieval grafted in, how deep its accepted paths reach, and what a draft forward
costs on each atlas's own curves (the head is one layer on the target's features, the draft model
a whole small model)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from talon.atlas.data import Atlas
from talon.atlas.replay import replay
from talon.atlas.result import ReplayResult
from talon.run_config import ConfigError, RunConfig, TreeConfig

# the draft slot's kinds, alone and with retrieval: (head's, draft model's)
ROLES: dict[str, tuple[str, str]] = {"alone": ("eagle3", "model"), "with retrieval": ("eagle3-hybrid", "hybrid")}
DEEP = 3  # "deep": a step that kept at least this many drafted tokens


@dataclass(frozen=True)
class HeadVsModel:
    """One prompt drafted by a head and by a draft model, replayed at the same knobs."""

    prompt: str
    budget: int
    tokens: int  # of the target's text replayed (the shorter atlas's)
    mat: dict[str, float]  # drafter kind -> MAT
    tokens_per_s: dict[str, float]  # drafter kind -> predicted, on its own atlas's cost curves
    deep_share: dict[str, float]  # drafter kind -> share of steps keeping >= DEEP drafted tokens
    draft_ms: tuple[float, float]  # one draft forward of one node: (head's atlas, draft model's atlas)

    def ratio(self, role: str) -> float:
        """The head's MAT over the draft model's, alone or with retrieval."""
        head, model = ROLES[role]
        return self.mat[head] / self.mat[model] if self.mat[model] else 0.0


def pairs_of(atlases: Sequence[Atlas]) -> list[tuple[Atlas, Atlas]]:
    """(head's atlas, draft model's atlas) for every prompt that has both: the same prompt ids and
    the same target text (as far as the shorter goes)."""
    found = []
    for head in (a for a in atlases if a.draft_kind == "head"):
        for model in (a for a in atlases if a.draft_kind == "draft"):
            n = min(len(head.output), len(model.output))
            if head.prompt_ids == model.prompt_ids and n and head.output[:n] == model.output[:n]:
                found.append((head, model))
    return found


def _share_deep(result: ReplayResult) -> float:
    steps = result.steps
    return sum(1 for s in steps if len(s.accepted) - 1 >= DEEP) / len(steps) if steps else 0.0


def head_vs_model(head: Atlas, model: Atlas, budget: int = 16) -> HeadVsModel:
    """Replay both atlases' draft slots, alone and with retrieval, at the app's default knobs and
    N = ``budget``; ConfigError where they are not two slots' atlases of one prompt."""
    if (head.draft_kind, model.draft_kind) != ("head", "draft") or not pairs_of([head, model]):
        raise ConfigError("a head against a draft model needs two atlases of one prompt and one target: one "
                          "recorded with an EAGLE-3 head, one with a draft model")
    tokens = min(len(head.output), len(model.output))
    mat, rate, deep = {}, {}, {}
    for head_kind, model_kind in ROLES.values():
        for atlas, kind in ((head, head_kind), (model, model_kind)):
            cfg = RunConfig(drafter=kind, max_new_tokens=tokens, cost_model="fixed", tree=TreeConfig(budget=budget),
                            draft_vocab=int(atlas.models.get("draft_vocab", RunConfig.draft_vocab)))
            result = replay(atlas, cfg)
            mat[kind], rate[kind], deep[kind] = result.mat, result.tokens_per_s, _share_deep(result)
    draft_ms = (1000 * head.cost_model().draft_s(1), 1000 * model.cost_model().draft_s(1))
    return HeadVsModel(head.prompt, budget, tokens, mat, rate, deep, draft_ms)
