"""The Threshold explorer and Serve it on an atlas recorded with an EAGLE-3 head: its drafter
choices follow the atlas (eagle3, eagle3-hybrid, retrieval), a draft model's kind moves to its
head counterpart, the heatmaps' grids and the best configuration replay the head, and the
engines' best settings are SGLang ``EAGLE3`` and vLLM ``eagle3``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from talon.atlas.data import Atlas, parse_atlas
from talon.atlas.explorer import AtlasSession, Knobs, best_knobs, drafters_of, explore
from talon.atlas.forecast import forecast
from talon.atlas.serving import serving_config
from talon.knobs import ATLAS_DRAFTING_KINDS, HEAD_ATLAS_DRAFTING_KINDS
from talon.run_config import RunConfig


@pytest.fixture(scope="module")
def head_atlas(head_atlas_file: Path) -> Atlas:
    return parse_atlas(json.loads(head_atlas_file.read_text(encoding="utf-8")))


def test_a_head_atlas_offers_the_heads_kinds(head_atlas: Atlas) -> None:
    assert head_atlas.draft_kind == "head"
    assert drafters_of(head_atlas) == HEAD_ATLAS_DRAFTING_KINDS == ("retrieval", "eagle3", "eagle3-hybrid")
    assert drafters_of(None) == ATLAS_DRAFTING_KINDS


@pytest.mark.parametrize(("asked", "replayed"), [("hybrid", "eagle3-hybrid"), ("model", "eagle3"),
                                                 ("eagle3", "eagle3"), ("retrieval", "retrieval")])
def test_the_explorer_replays_a_head_atlas_with_the_heads_counterpart(head_atlas: Atlas, asked: str,
                                                                     replayed: str) -> None:
    session = AtlasSession()
    session.load(head_atlas, None)
    found = explore(session, Knobs.from_ui(drafter=asked, budget=12))
    rows = found.rows
    assert {row.values["drafter"] for row in rows} == {replayed}
    assert len(found.mu_budget) == 25 and len(found.root_top) == 16  # the heatmaps' grids, all replayed
    assert found.best.values["drafter"] == replayed
    if replayed != "retrieval":
        assert found.current.mat >= 1.5, "the head's drafts are accepted"
        assert len({round(row.tokens_per_s, 6) for row in found.mu_budget}) > 1, "the knobs change the replay"


def test_the_best_configuration_of_a_head_atlas_is_the_heads(head_atlas: Atlas) -> None:
    session = AtlasSession()
    session.load(head_atlas, None)
    best = best_knobs(session, Knobs.from_ui(drafter="hybrid"))
    assert best.drafter == "eagle3-hybrid"
    assert best.config(head_atlas).drafter == "eagle3-hybrid"


def test_serve_it_takes_the_engines_best_eagle3_settings_from_a_head_atlas(head_atlas: Atlas) -> None:
    cfg = RunConfig(drafter="eagle3-hybrid", max_new_tokens=len(head_atlas.output))
    exported = serving_config(cfg, head_atlas.models["target"], head_atlas.models["draft"])
    text = forecast(head_atlas, cfg, exported).markdown()
    assert "SGLang EAGLE3" in text and "vLLM eagle3" in text, text
    assert "STANDALONE" not in text and "draft_model" not in text, text
    assert "Talon, the current controls | MAT" in text


def test_serve_it_replays_a_draft_models_controls_as_the_heads_counterpart(head_atlas: Atlas) -> None:
    cfg = RunConfig(drafter="hybrid", max_new_tokens=len(head_atlas.output))
    exported = serving_config(cfg, head_atlas.models["target"], head_atlas.models["draft"])
    text = forecast(head_atlas, cfg, exported).markdown()
    assert "Talon, the current controls (as eagle3-hybrid" in text and "| MAT" in text
