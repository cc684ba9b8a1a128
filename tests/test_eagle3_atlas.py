"""An atlas recorded with an EAGLE-3 head: Talon's replays of the head's kinds equal real runs step
for step, and the serving engines' EAGLE-3 rules (SGLang EAGLE3's tree, vLLM eagle3's chain)
replay from it.

A head's node below the root reads the head's own output where the root one position later
reads the target's feature, so a head's atlas keys every node by its own position; recorded
with a draft model's shared keys instead (planted), the replays part from the real runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from talon.atlas.data import Atlas, canonical_key, parse_atlas
from talon.atlas.loop import compare_runs
from talon.atlas.record import PairRecorder, record_atlas
from talon.atlas.replay import replay
from talon.atlas.result import check_replayable
from talon.atlas.serving_replay import SglangStandalone, VllmDraftModel, replay_serving
from talon.atlas.serving_sweep import DEFAULT_GRIDS, serving_policies
from talon.atlas.superset import SupersetRecorder
from talon.cli.main import main
from talon.cost.model import synthetic_costs
from talon.engine.engine import Engine, generate
from talon.run_config import ConfigError, RunConfig, TreeConfig
from tests.tiny import HEAD_PROMPTS as PROMPTS
from tests.tiny import greedy_text, trained_pair

HEAD_TOKENS = 40
HEAD_ATLAS_COSTS = synthetic_costs({1: 0.1, 4: 0.11, 16: 0.14, 64: 0.3}, {1: 0.004, 16: 0.006, 64: 0.012})


@pytest.fixture(scope="module")
def head_engine() -> Engine:
    target, head = trained_pair()
    return Engine(target, head, costs=HEAD_ATLAS_COSTS)


def prompts(head_engine: Engine) -> list[list[int]]:
    """Prompts followed by the target's own greedy text, as the head was trained on."""
    return [greedy_text(head_engine.target, p, 12) for p in PROMPTS[:2]]


@pytest.fixture(scope="module")
def head_atlases(head_engine: Engine) -> list[Atlas]:
    cfg = RunConfig(drafter="eagle3-hybrid", max_new_tokens=HEAD_TOKENS, chat_template=False)
    return [record_atlas(head_engine, ids, cfg) for ids in prompts(head_engine)]


def head_configs() -> list[RunConfig]:
    return [RunConfig(drafter=drafter, max_new_tokens=HEAD_TOKENS, chat_template=False, cost_model="fixed",
                      tree=TreeConfig(mode=mode, budget=12, cost_aware=cost_aware))
            for drafter in ("eagle3", "eagle3-hybrid") for mode in ("adaptive", "static", "chain")
            for cost_aware in (False, True) if not (cost_aware and mode != "adaptive")]


def replays_equal_runs(head_engine: Engine, head_atlases: list[Atlas], cfg: RunConfig) -> tuple[bool, str]:
    """Whether every prompt's replay equals its real run: the same trees, accepted lengths and text."""
    for ids, atlas in zip(prompts(head_engine), head_atlases):
        summary, steps = generate(head_engine, ids, cfg)
        result = replay(atlas, cfg)
        assert result.summary.token_ids == summary.token_ids == atlas.output
        agreement = compare_runs(steps, result.steps, coverage=result.coverage)
        if not agreement.equal or [s.tokens for s in steps] != [s.tokens for s in result.steps]:
            return False, agreement.reason or "the trees differ"
        if summary.mean_accepted_tokens < 1.5:
            return False, f"MAT {summary.mean_accepted_tokens:.2f}: the head must have its drafts accepted"
    return True, ""


@pytest.mark.parametrize("cfg", head_configs(), ids=lambda c: f"{c.drafter}-{c.tree.mode}-"
                         f"{'cost' if c.tree.cost_aware else 'nocost'}")
def test_replay_of_a_head_atlas_equals_the_real_run(head_engine: Engine, head_atlases: list[Atlas],
                                                    cfg: RunConfig) -> None:
    equal, why = replays_equal_runs(head_engine, head_atlases, cfg)
    assert equal, why
    for atlas in head_atlases:  # a node outside the recorded superset is counted and named, never a rejection
        coverage = replay(atlas, cfg).coverage
        assert coverage.share > 0.95 and bool(coverage.misses) == bool(coverage.first_miss)


def test_a_head_atlas_keys_every_node_by_its_own_position(head_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the head's atlas recorded and read with a draft model's shared keys (a node on the
    text taken for the root one position later): the replays part from the real runs."""
    monkeypatch.setattr(PairRecorder, "canonical", SupersetRecorder.canonical)
    monkeypatch.setattr(Atlas, "canonical", lambda self, p, path: canonical_key(self.output, p, path))
    recorded = RunConfig(drafter="eagle3-hybrid", max_new_tokens=HEAD_TOKENS, chat_template=False)
    shared = [record_atlas(head_engine, ids, recorded) for ids in prompts(head_engine)]
    assert not all(replays_equal_runs(head_engine, shared, cfg)[0] for cfg in head_configs())


def test_each_atlas_replays_the_kinds_of_its_draft_slot(head_atlases: list[Atlas]) -> None:
    atlas = head_atlases[0]
    assert atlas.draft_kind == "head" and parse_atlas(json.loads(json.dumps(atlas.to_dict()))).draft_kind == "head"
    with pytest.raises(ConfigError, match="EAGLE-3 head.*not 'hybrid'"):
        check_replayable(atlas, RunConfig(drafter="hybrid", draft_vocab=0))
    as_model = Atlas(**{**atlas.__dict__, "models": {**atlas.models, "draft_kind": "draft"}})
    with pytest.raises(ConfigError, match="draft model.*not 'eagle3'"):
        check_replayable(as_model, RunConfig(drafter="eagle3"))
    check_replayable(atlas, RunConfig(drafter="retrieval"))  # no model: either atlas replays it
    bad = {**atlas.to_dict(), "models": {**atlas.models, "draft_kind": "medusa"}}
    with pytest.raises(Exception, match="draft_kind"):
        parse_atlas(bad)


def test_the_engines_eagle3_rules_replay_from_a_head_atlas(head_atlases: list[Atlas]) -> None:
    """vLLM eagle3's chain follows the text as far as the head's argmax does: always covered (the
    recorder keeps every position's on-text chain); SGLang EAGLE3's tree is the EAGLE-2 worker over
    the head, accepting more than one token a step here."""
    for engine_name, word in (("vllm", "vLLM eagle3"), ("sglang", "SGLang EAGLE3")):
        policies = serving_policies(engine_name, DEFAULT_GRIDS[engine_name], "head")
        assert any(p.label().startswith(word) for _, p in policies)
        assert not any("draft_model" in p.label() or "STANDALONE" in p.label() for _, p in policies)
    for atlas in head_atlases:
        chain = replay_serving(atlas, VllmDraftModel(4, method="eagle3"))
        outside = [s.missing for s in chain.steps if s.missing and "recorded tokens" not in s.missing]
        assert not outside and chain.num_accepted_tokens > 0
        tree = replay_serving(atlas, SglangStandalone(4, 3, 8, algorithm="EAGLE3"))
        assert 1 + tree.num_accepted_tokens / len(tree.steps) > 1.5


def test_the_command_line_sweeps_sglang_on_a_head_atlas(head_atlases: list[Atlas], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    for i, atlas in enumerate(head_atlases):
        (tmp_path / f"a{i}.json").write_text(json.dumps(atlas.to_dict()), encoding="utf-8")
    assert main(["atlas", "sweep", str(tmp_path), "--engine", "sglang", "--grid", "topk=1,4", "--grid",
                 "num_steps=3,5", "--grid", "num_draft_tokens=8,16"]) == 0
    out = capsys.readouterr().out
    assert "SGLang EAGLE3, topk=4" in out and "STANDALONE" not in out
    assert main(["atlas", "sweep", str(tmp_path), "--grid", "drafter=eagle3,eagle3-hybrid", "--grid",
                 "budget=8,16"]) == 0
    assert "eagle3-hybrid" in capsys.readouterr().out
