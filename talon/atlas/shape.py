"""The shape replay: a real run on real forwards, answered from an atlas.

An engine's models (random weights at a preset's shapes, on a GPU) run every forward, bucket,
graph replay, cache move and host decision of a real run, but what a forward *says* comes from a
recorded draft atlas (``talon.atlas.loop``): each draft forward's children are the atlas's top-k
at that node, each verification's verdict the atlas's greedy text. So the builder, the gates and
the planner grow the trees the embedded pair's real acceptance grows and accept its paths, while
the clock times this device's own step: tokens/s measured, not predicted, with real acceptance.

The real forwards run first and their readouts are dropped; the tree then holds the atlas's
tokens, which the next forward feeds, and the target's cache keeps the accepted path's entries as
in any run. Greedy only, host-grown trees only (the device-grown tree reads its own top-k on the
device, where no atlas can answer), and the atlas's ids must fit the models' vocabulary.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from talon.atlas.data import Atlas
from talon.atlas.loop import AtlasModel, TextVerifier
from talon.atlas.replay import replay
from talon.atlas.result import Coverage, check_replayable
from talon.core.contracts import DraftSource, Verdict, Verifier
from talon.drafters import SOURCE_MAKERS
from talon.drafters.retrieval import Retriever
from talon.drafters.tree_drafter import build_drafter
from talon.engine.engine import Engine
from talon.engine.prompt import StopCheck
from talon.engine.run import Run, RunParts
from talon.run_config import ConfigError, RunConfig
from talon.trace import RunModels, RunSummary, StepTrace
from talon.tree import DraftTree


class ShapeSource:
    """A real draft source whose forwards run and whose children come from the atlas. It answers
    the ``DraftSource`` calls and nothing else: a call it does not know (a fork, a device-grown
    tree) raises, so no real proposal reaches the tree unseen."""

    def __init__(self, real: DraftSource, told: AtlasModel) -> None:
        self.real, self.told = real, told

    @property
    def engaged(self) -> bool:
        return self.real.engaged

    @property
    def pending(self) -> int:
        return self.real.pending

    @property
    def last_width(self) -> int:
        return self.real.last_width

    def reset(self, prompt_ids: list[int], prefill: bool = True) -> None:
        self.real.reset(prompt_ids, prefill)
        self.told.reset(prompt_ids, prefill)

    def expand(self, tree: DraftTree, nodes: list[int], k: int) -> list[list[tuple[int, float]]]:
        self.real.expand(tree, nodes, k)  # the forward, timed; what it proposes is not used
        return self.told.expand(tree, nodes, k)

    def commit(self, tree: DraftTree, accepted: list[int], new_tokens: list[int]) -> None:
        self.real.commit(tree, accepted, new_tokens)
        self.told.commit(tree, accepted, new_tokens)

    def take_timings(self) -> list[tuple[int, float]]:
        self.told.take_timings()
        return self.real.take_timings()

    @property
    def context(self) -> list[int]:
        return self.real.context

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """A head's (so the drafter hands it the target's features); a draft model has none."""
        return self.real.feature_layers  # AttributeError for a draft model: not a FeatureSource

    def add_features(self, features: Any) -> None:
        """The target's features for a head's next forward (what it proposes is still the atlas's)."""
        self.real.add_features(features)

    def close(self) -> None:
        if hasattr(self.real, "close"):
            self.real.close()


class ShapeVerifier:
    """A real verifier whose forward runs and whose verdict is the atlas's greedy text."""

    def __init__(self, real: Verifier, told: TextVerifier) -> None:
        self.real, self.told = real, told

    def prefill(self, ids: list[int]) -> Any:
        features = self.real.prefill(ids)  # a head's features come from the real forwards
        self.told.prefill(ids)
        return features

    def verify(self, tree: DraftTree) -> Verdict:
        forward = self.real.verify(tree)  # the target's forward and readout, timed
        text = self.told.verify(tree)
        return Verdict(text.top1, text.acceptance, forward.topk, forward.positions, forward.features)

    def commit(self, verdict: Verdict) -> None:
        self.real.commit(verdict)  # the accepted path's KV kept, the rest dropped
        self.told.commit(verdict)

    def close(self) -> None:
        self.real.close()


def check_shape_replayable(engine: Engine, atlas: Atlas, cfg: RunConfig) -> None:
    """ConfigError when ``engine`` cannot run ``cfg`` answered from ``atlas``."""
    check_replayable(atlas, cfg)
    if engine.forwards.chain:
        raise ConfigError("the shape replay answers the host's tree: the device-grown tree (chain) reads its "
                          "own top-k on the device")
    vocab = engine.target.model.get_input_embeddings().num_embeddings  # the draft reads them as in a real run
    top = max([*atlas.prompt_ids, *atlas.output, *(t for kids in atlas.children.values() for t, _ in kids)])
    if top >= vocab:
        raise ConfigError(f"the atlas holds token id {top}, beyond these models' vocabulary of {vocab}")


def shape_run(engine: Engine, atlas: Atlas, cfg: RunConfig) -> tuple[Run, Coverage]:
    """A ``Run`` of ``cfg`` on ``engine``'s forwards answered from ``atlas`` (iterate it for steps)."""
    cfg = cfg.replace(async_draft=False, max_new_tokens=min(cfg.max_new_tokens, len(atlas.output)))
    check_shape_replayable(engine, atlas, cfg)
    coverage = Coverage()
    prompt_ids = list(atlas.prompt_ids)
    costs = engine.cost_snapshot(cfg.draft_vocab) if cfg.tree.cost_aware and cfg.drafts else None
    model, feature_layers = None, ()
    if cfg.uses_model:
        real = SOURCE_MAKERS[cfg.drafter](engine, cfg, len(prompt_ids))
        model = ShapeSource(real, AtlasModel(atlas, atlas.cost_model(), coverage))
        feature_layers = getattr(real, "feature_layers", ())  # a head reads the target's features
    retrieval = Retriever(cfg.retrieval) if cfg.uses_retrieval else None
    parts = RunParts(
        prompt_ids=prompt_ids,
        prompt_text=atlas.prompt,
        drafter=build_drafter(cfg, model, retrieval),
        verifier=ShapeVerifier(engine.forwards.verifier(cfg, len(prompt_ids), feature_layers), TextVerifier(atlas)),
        stop=StopCheck(None, set(atlas.eos), (), cfg.max_new_tokens),
        token_text=atlas.text,
        detokenize=atlas.detokenize,
        models=RunModels(target=engine.target.name, draft=engine.draft.name if engine.draft else "none",
                         dtype=str(engine.target.dtype).removeprefix("torch."), device=str(engine.target.device),
                         forward_path=engine.forward_path),
        costs=costs.copy() if costs is not None else None,
    )
    return Run(cfg, parts, engine=engine), coverage


@dataclass
class ShapeResult:
    """One configuration on one atlas: the measured run and, beside it, the atlas replay's
    prediction under the same engine's cost curves."""

    summary: RunSummary
    steps: list[StepTrace]
    coverage: Coverage
    predicted: RunSummary
    replayed: list[StepTrace] = dataclasses.field(default_factory=list)  # the atlas replay's steps

    @property
    def same_trees(self) -> bool:
        """Every step grew the tree the atlas replay grows (which a readout leaking a forward's own
        proposals would change) and accepted as much."""
        return ([(s.tokens, s.parents, len(s.new_tokens)) for s in self.steps]
                == [(s.tokens, s.parents, len(s.new_tokens)) for s in self.replayed])

    @property
    def tokens_per_s(self) -> float:
        return self.summary.tokens_per_second

    @property
    def predicted_tokens_per_s(self) -> float:
        return self.predicted.tokens_per_second


def shape_replay(engine: Engine, atlas: Atlas, cfg: RunConfig) -> ShapeResult:
    """Run ``cfg`` on ``engine`` answered from ``atlas``, and replay it on the engine's curves."""
    run, coverage = shape_run(engine, atlas, cfg)
    for _ in run:
        pass
    assert run.summary is not None
    costed = dataclasses.replace(atlas, costs=engine.cost_snapshot(cfg.draft_vocab).to_dict())
    predicted = replay(costed, cfg.replace(max_new_tokens=run.cfg.max_new_tokens))
    return ShapeResult(run.summary, run.steps, coverage, predicted.summary, predicted.steps)
