"""The shape replay (``talon.atlas.shape``): another pair's real forwards, answered from an atlas,
decode the atlas's text in the atlas replay's steps with its trees, on every step kind the CPU
runs; the measured run and the prediction on the same curves come back side by side."""

from __future__ import annotations

import pytest

from talon.atlas.data import Atlas
from talon.atlas.record import record_atlas
from talon.atlas.replay import replay
from talon.atlas.shape import shape_replay, shape_run
from talon.cost.model import synthetic_costs
from talon.engine.engine import Engine
from talon.run_config import ConfigError, RunConfig, TreeConfig
from tests.tiny import ATLAS_COSTS, ATLAS_PROMPTS, atlas_engine, tiny_loaded


@pytest.fixture(scope="module")
def shape_atlas() -> Atlas:
    recorder = atlas_engine()
    return record_atlas(recorder, ATLAS_PROMPTS[1], RunConfig(max_new_tokens=32, draft_vocab=0))


def other_pair(step: str) -> Engine:
    """Other weights, the same vocabulary: what its forwards would say differs from the atlas."""
    return Engine(tiny_loaded("llama", 31), tiny_loaded("llama", 32), forward=step,
                  costs=synthetic_costs(ATLAS_COSTS["verify"], ATLAS_COSTS["draft"]))


@pytest.mark.parametrize("step", ["dynamic", "static"])
@pytest.mark.parametrize("drafter", ["hybrid", "model", "retrieval", "none"])
def test_another_pairs_forwards_decode_the_atlas_in_its_steps(shape_atlas: Atlas, step: str, drafter: str) -> None:
    cfg = RunConfig(drafter=drafter, tree=TreeConfig(cost_aware=False), max_new_tokens=32, draft_vocab=0)
    engine = other_pair(step)
    result = shape_replay(engine, shape_atlas, cfg)
    told = replay(shape_atlas, cfg)
    assert result.coverage.misses == 0
    assert result.summary.token_ids == told.summary.token_ids == shape_atlas.output[:len(result.summary.token_ids)]
    assert result.summary.steps == told.summary.steps and len(result.steps) == len(told.steps)
    assert [s.parents for s in result.steps] == [s.parents for s in told.steps]  # the trees' shapes and widths
    assert [s.tokens for s in result.steps] == [s.tokens for s in told.steps]
    assert [s.accepted for s in result.steps] == [s.accepted for s in told.steps]
    if drafter in ("hybrid", "model"):
        assert result.summary.draft_forwards > 0 and result.summary.mean_accepted_tokens > 1.2  # drafts accepted
    assert result.tokens_per_s > 0 and result.predicted_tokens_per_s > 0
    assert result.predicted.steps == told.summary.steps


def test_the_pairs_own_forwards_would_have_said_otherwise(shape_atlas: Atlas) -> None:
    """The substitution is what makes the trees the atlas's: the other pair decoding for itself
    writes another text."""
    cfg = RunConfig(drafter="hybrid", tree=TreeConfig(cost_aware=False), max_new_tokens=32, draft_vocab=0)
    engine = other_pair("dynamic")
    own = list(engine.run(list(shape_atlas.prompt_ids), cfg))
    assert [t for s in own for t in s.new_tokens] != list(shape_atlas.output[:32])


def test_what_it_cannot_answer_is_refused(shape_atlas: Atlas) -> None:
    sampled = RunConfig(drafter="hybrid", max_new_tokens=8, draft_vocab=0).replace(
        sampling=RunConfig().sampling.__class__(temperature=0.7))
    with pytest.raises(ConfigError, match="greedy only"):
        shape_run(other_pair("dynamic"), shape_atlas, sampled)
    narrow = Engine(tiny_loaded("llama", 31, vocab=64), tiny_loaded("llama", 32, vocab=64))
    with pytest.raises(ConfigError, match="beyond these models' vocabulary"):
        shape_run(narrow, shape_atlas, RunConfig(drafter="hybrid", max_new_tokens=8, draft_vocab=0))


def test_the_device_script_measures_every_drafter_beside_generate_and_the_prediction(tmp_path) -> None:  # noqa: ANN001
    """``python -m talon.gpucheck.shape --tiny``: what a GPU runs at a preset's shapes, on the CPU."""
    import json

    from talon.gpucheck.shape import main

    out = tmp_path / "shape.json"
    assert main(["--tiny", "--limit", "1", "--tokens", "16", "--forward", "static", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["faithful"] and report["forward"] == "static"
    assert report["clean_clock"] and report["built_while_timed"] == {}, "warmed: the clock times decoding only"
    rows = report["rows"]
    assert list(rows) == ["none", "retrieval", "model", "hybrid", "generate()"]
    assert rows["hybrid"]["tokens"] / rows["hybrid"]["steps"] > 1.2  # drafts accepted
    assert all(r["seconds"] > 0 for r in rows.values()) and rows["hybrid"]["predicted_s"] > 0


def test_the_device_script_measures_a_head_preset_with_its_trained_head(tmp_path) -> None:  # noqa: ANN001
    """A head preset: its head trained on the random target's text, atlases recorded with it, the
    head's kinds measured on the static forward (the target's features read inside its buckets),
    faithful to the atlases, drafts accepted."""
    import json

    from talon.gpucheck.shape import main

    out = tmp_path / "shape.json"
    assert main(["--tiny", "--pair", "llama-3.1-8b-eagle3", "--tokens", "16", "--forward", "static",
                 "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert report["faithful"] and report["clean_clock"] and report["atlases"] == 2
    assert list(rows) == ["none", "retrieval", "eagle3", "eagle3-hybrid", "generate()"]
    assert rows["eagle3"]["tokens"] / rows["eagle3"]["steps"] >= 1.5 and rows["eagle3"]["predicted_s"] > 0


def test_a_run_that_builds_while_timed_fails_the_device_script(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: no warm-up, so the timed runs build the static forwards (on CUDA: capture graphs):
    counted, and the script exits 1."""
    import talon.gpucheck.shape as device_script

    real = device_script.shape_replay
    warmed: list[bool] = []

    def unwarmed(engine, shape_atlas, cfg):  # noqa: ANN001, ANN202 - the warm-up pass skipped
        if len(warmed) < 4:  # the warm-up's four kinds (none, retrieval, model, hybrid) on the one atlas
            warmed.append(True)
            return None
        return real(engine, shape_atlas, cfg)

    monkeypatch.setattr(device_script, "shape_replay", unwarmed)
    monkeypatch.setattr(device_script, "reference", lambda *a: None)  # the warm-up's generate() too
    assert device_script.main(["--tiny", "--limit", "1", "--tokens", "8", "--forward", "static"]) == 1


def test_a_readout_of_the_forwards_own_proposals_fails_faithfulness(shape_atlas: Atlas,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the shape source hands the tree the real forward's top-k, not the atlas's. The
    text is still the atlas's (verification reads it), but the trees are not the atlas replay's."""
    from talon.atlas.shape import ShapeSource

    monkeypatch.setattr(ShapeSource, "expand", lambda self, tree, nodes, k: self.real.expand(tree, nodes, k))
    cfg = RunConfig(drafter="model", max_new_tokens=16, draft_vocab=0)
    result = shape_replay(other_pair("dynamic"), shape_atlas, cfg)
    assert result.summary.token_ids == shape_atlas.output[:16] and not result.same_trees


def test_a_replay_that_leaves_its_atlas_makes_the_device_script_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """The atlases cut after their first positions: the replays ask for children the atlas does not
    hold, which is counted, and the script exits 1."""
    import talon.gpucheck.shape as device_script

    recorded = device_script.atlases_for

    def pruned(*args):  # noqa: ANN002, ANN202
        atlases = recorded(*args)
        for a in atlases:
            a.children = {key: kids for key, kids in a.children.items() if key[0] < 4}
        return atlases

    monkeypatch.setattr(device_script, "atlases_for", pruned)
    assert device_script.main(["--tiny", "--limit", "1", "--tokens", "16"]) == 1


def test_the_shape_source_answers_only_a_draft_sources_calls(shape_atlas: Atlas) -> None:
    from talon.atlas.shape import ShapeSource

    run, _ = shape_run(other_pair("dynamic"), shape_atlas, RunConfig(drafter="model", max_new_tokens=8, draft_vocab=0))
    source = run.drafter.source
    assert isinstance(source, ShapeSource)
    for name in ("fork", "chained_tree", "chains"):
        with pytest.raises(AttributeError):
            getattr(source, name)
