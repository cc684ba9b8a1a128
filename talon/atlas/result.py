"""A replay's records, free of torch: ``Coverage`` (how many draft expansions the atlas
answered), ``ReplayResult`` (a replayed run), and which drafter kinds an atlas replays
(``replayable_kinds``, ``for_slot``, ``check_replayable``). The replay itself:
``talon.atlas.replay.replay``, over the step loop of ``talon.atlas.loop``."""

from __future__ import annotations

from dataclasses import dataclass, field

from talon.atlas.data import Atlas
from talon.knobs import ATLAS_KINDS, HEAD_ATLAS_KINDS, MTP_ATLAS_KINDS, MTP_COUNTERPART, slot_kind
from talon.run_config import ConfigError, RunConfig
from talon.trace import RunSummary, StepTrace


@dataclass
class Coverage:
    """How many draft-model expansions the atlas answered."""

    requests: int = 0
    misses: int = 0
    first_miss: str = ""  # the first request it could not answer, in words
    missing: set[tuple[int, tuple[int, ...]]] = field(default_factory=set)  # canonical keys it could not answer

    @property
    def share(self) -> float:
        return 1.0 - self.misses / self.requests if self.requests else 1.0


@dataclass
class ReplayResult:
    """A replayed run: the same summary and steps a real run gives, MAT exactly, time predicted
    by the atlas's cost model, and how much of it the atlas covered."""

    summary: RunSummary
    steps: list[StepTrace]
    coverage: Coverage = field(default_factory=Coverage)

    @property
    def exact(self) -> bool:
        return self.coverage.misses == 0

    @property
    def predicted_s(self) -> float:
        return self.summary.seconds

    @property
    def mat(self) -> float:
        return self.summary.mean_accepted_tokens

    @property
    def tokens_per_s(self) -> float:
        """Predicted: the tokens over the time the atlas's cost curves give the run."""
        return len(self.summary.token_ids) / self.predicted_s if self.predicted_s > 0 else 0.0


def replayable_kinds(atlas: Atlas) -> tuple[str, ...]:
    """The drafter kinds ``atlas`` replays: those of the model that drafted in its draft slot."""
    return {"head": HEAD_ATLAS_KINDS, "mtp": MTP_ATLAS_KINDS}.get(atlas.draft_kind, ATLAS_KINDS)


def for_slot(atlas: Atlas, cfg: RunConfig) -> RunConfig:
    """``cfg`` with a drafter ``atlas`` replays: a draft model's kind becomes the EAGLE-3 head's
    counterpart on a head's atlas (hybrid and eagle3-hybrid, model and eagle3), and back."""
    kinds = replayable_kinds(atlas)
    if cfg.drafter in kinds:
        return cfg
    if atlas.draft_kind == "mtp":
        return cfg.replace(drafter=MTP_COUNTERPART.get(cfg.drafter, kinds[0]))
    return cfg.replace(drafter=slot_kind(atlas.draft_kind == "head", kinds, cfg.drafter))


def check_replayable(atlas: Atlas, cfg: RunConfig) -> None:
    """ConfigError when ``cfg`` cannot be replayed from ``atlas`` at all."""
    if not cfg.sampling.greedy:
        raise ConfigError("exact replay is greedy only: set the temperature to 0 (sampled output depends on "
                          "the target's probabilities, which the atlas does not hold)")
    if cfg.retrieval.corpus:
        raise ConfigError("replay reads retrieval from the prompt and the text only: remove the corpus")
    kinds = replayable_kinds(atlas)
    if cfg.drafter not in kinds:
        slot = {"head": "an EAGLE-3 head", "mtp": "the target's MTP layer"}.get(atlas.draft_kind, "a draft model")
        raise ConfigError(f"this atlas records {slot}'s and retrieval's children, so it replays the drafters "
                          f"{', '.join(kinds)}, not {cfg.drafter!r}" + ("" if cfg.kind.atlas else ": run it for real"))
    if cfg.draft_vocab != atlas.models.get("draft_vocab", cfg.draft_vocab):
        raise ConfigError(f"the atlas was recorded with draft_vocab {atlas.models.get('draft_vocab')}, "
                          f"not {cfg.draft_vocab}: the draft's q depends on it")
