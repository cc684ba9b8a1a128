"""MTP against EAGLE-3 against a draft model: the drafter a model ships (its MTP layer, one block
reused at every depth), the head trained for it and a separate small model. Atlases of one prompt
on one target, each recorded with one of them drafting (the same greedy text), replayed alone at
the same knobs: tokens kept a step, predicted tokens/s on each atlas's own cost curves, and, from
the replays, how often each depth is accepted once the depth above it was: what reusing one
block costs as the draft goes deeper."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from talon.atlas.data import Atlas
from talon.atlas.replay import replay
from talon.run_config import ConfigError, RunConfig, TreeConfig

# an atlas's drafter (``Atlas.draft_kind``) -> the drafter kind that replays it alone, and its name
ALONE: dict[str, str] = {"mtp": "mtp", "head": "eagle3", "draft": "model"}
NAMES: dict[str, str] = {"mtp": "MTP layer", "head": "EAGLE-3 head", "draft": "draft model"}
LINEUP_DEPTHS = 6  # the depths whose acceptance the lesson reports


@dataclass(frozen=True)
class DrafterLineup:
    """One prompt drafted by an MTP layer and by one or both of a head and a draft model."""

    prompt: str
    budget: int
    tokens: int  # of the target's text replayed (the shortest atlas's)
    kinds: tuple[str, ...]  # the atlases' drafters, "mtp" first
    mat: dict[str, float]  # drafter -> MAT
    tokens_per_s: dict[str, float]  # drafter -> predicted, on its own atlas's cost curves
    depth_accept: dict[str, list[float | None]]  # drafter -> P(depth d accepted | d - 1 was), d = 1..LINEUP_DEPTHS
    draft_ms: dict[str, float]  # drafter -> one draft forward of one node, on its atlas's curves


def lineups_of(atlases: Sequence[Atlas]) -> list[dict[str, Atlas]]:
    """For every prompt with an MTP layer's atlas, the atlases of the same prompt ids and target
    text (as far as the shorter goes) by drafter, where a head's or a draft model's is among them."""
    found = []
    for mtp in (a for a in atlases if a.draft_kind == "mtp"):
        group = {"mtp": mtp}
        for other in atlases:
            n = min(len(mtp.output), len(other.output))
            if (other.draft_kind in ("head", "draft") and other.draft_kind not in group
                    and other.prompt_ids == mtp.prompt_ids and n and other.output[:n] == mtp.output[:n]):
                group[other.draft_kind] = other
        if len(group) > 1:
            found.append(group)
    return found


def depth_acceptance(accept_lens: Sequence[int], depths: int = LINEUP_DEPTHS) -> list[float | None]:
    """Per depth d = 1..``depths``: of the steps that accepted d - 1 drafted tokens or more, the
    share that accepted d or more (None where no step got that far)."""
    out: list[float | None] = []
    for d in range(1, depths + 1):
        reached = sum(1 for a in accept_lens if a >= d - 1)
        out.append(sum(1 for a in accept_lens if a >= d) / reached if reached else None)
    return out


def mtp_lineup(group: dict[str, Atlas], budget: int = 16) -> DrafterLineup:
    """Replay each atlas's drafter alone at the app's default knobs and N = ``budget``."""
    if "mtp" not in group or len(group) < 2:
        raise ConfigError("MTP against EAGLE-3 against a draft model needs atlases of one prompt and one target: one "
                          "recorded with the target's MTP layer and one with an EAGLE-3 head or a draft model")
    kinds = tuple(k for k in ALONE if k in group)
    tokens = min(len(a.output) for a in group.values())
    mat, rate, depth, draft_ms = {}, {}, {}, {}
    for kind in kinds:
        atlas = group[kind]
        cfg = RunConfig(drafter=ALONE[kind], max_new_tokens=tokens, cost_model="fixed",
                        tree=TreeConfig(budget=budget, cost_aware=False),
                        draft_vocab=int(atlas.models.get("draft_vocab", RunConfig.draft_vocab)))
        result = replay(atlas, cfg)
        mat[kind], rate[kind] = result.mat, result.tokens_per_s
        depth[kind] = depth_acceptance([len(s.accepted) - 1 for s in result.steps])
        draft_ms[kind] = 1000 * atlas.cost_model().draft_s(1)
    return DrafterLineup(group["mtp"].prompt, budget, tokens, kinds, mat, rate, depth, draft_ms)
