"""Lessons: a head against a draft model, from two atlases of one prompt (the tiny target with its
trained EAGLE-3 head, and with a noisy copy of itself as the draft model): both slots replayed
at the same knobs, alone and with retrieval, the words computed from the replays; lessons of a
head's own atlas replay the head's kinds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from talon.atlas.data import Atlas, parse_atlas
from talon.atlas.explorer import AtlasSession
from talon.atlas.replay import replay
from talon.figures.lessons import head_words
from talon.lessons.head import ROLES, head_vs_model, pairs_of
from talon.lessons.hybrid import hybrid_lesson
from talon.run_config import ConfigError, RunConfig, TreeConfig
from talon.ui.lessons_tab import OWN, compare_head, make_show


def read(path: Path) -> Atlas:
    return parse_atlas(json.loads(path.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def both(head_atlas_file: Path, model_atlas_file: Path) -> tuple[Atlas, Atlas]:
    return read(head_atlas_file), read(model_atlas_file)


def test_two_slots_atlases_of_one_prompt_pair_up(both: tuple[Atlas, Atlas]) -> None:
    head, model = both
    assert (head.draft_kind, model.draft_kind) == ("head", "draft")
    assert pairs_of([model, head]) == [(head, model)]
    other = Atlas(**{**model.__dict__, "prompt_ids": model.prompt_ids[1:]})
    assert pairs_of([head, other]) == []  # another prompt: no pair


def test_the_head_and_the_draft_model_are_replayed_at_the_same_knobs(both: tuple[Atlas, Atlas]) -> None:
    head, model = both
    lesson = head_vs_model(head, model, budget=16)
    for atlas, kind in ((head, "eagle3"), (model, "model"), (head, "eagle3-hybrid"), (model, "hybrid")):
        cfg = RunConfig(drafter=kind, max_new_tokens=lesson.tokens, cost_model="fixed", tree=TreeConfig(budget=16),
                        draft_vocab=int(atlas.models.get("draft_vocab", RunConfig.draft_vocab)))
        assert lesson.mat[kind] == pytest.approx(replay(atlas, cfg).mat)
    assert lesson.mat["eagle3"] >= 1.5 and lesson.mat["model"] > 1.0, "both slots' drafts are accepted"
    assert lesson.ratio("alone") == pytest.approx(lesson.mat["eagle3"] / lesson.mat["model"])
    words = head_words(lesson)
    assert f"{lesson.mat['eagle3']:.2f}" in words and f"{lesson.mat['model']:.2f}" in words
    assert f"({lesson.ratio('alone'):.2f}x)" in words
    assert ("the head keeps more" in words) == (lesson.ratio("alone") > 1.02)
    with pytest.raises(ConfigError, match="one recorded with an EAGLE-3 head"):
        head_vs_model(model, head)


def test_the_lessons_tab_compares_its_uploads_with_the_explorers_atlas(head_atlas_file: Path,
                                                                        model_atlas_file: Path) -> None:
    session = AtlasSession()
    session.load(read(head_atlas_file), None)
    words, plot = compare_head([str(model_atlas_file)], 16, session)
    assert "EAGLE-3 head" in words and plot["visible"] is True
    fig = plot["value"]
    assert [t.name for t in fig.data] == ["EAGLE-3 head", "draft model"] and list(fig.data[0].x) == list(ROLES)
    words, plot = compare_head([], 16, session)
    assert "recorded with a draft model" in words and plot["visible"] is False


def test_a_heads_own_atlas_gives_every_lesson_in_the_heads_kinds(head_atlas_file: Path) -> None:
    atlas = read(head_atlas_file)
    lesson = hybrid_lesson(atlas)
    assert lesson.slot == "EAGLE-3 head" and lesson.mat["model"] >= 1.5
    assert set(lesson.carried) <= {"model", "retrieval", "both", "none"} and "model" in lesson.carried
    session = AtlasSession()
    session.load(atlas, None)
    shown = make_show()(OWN, 16, session)
    assert "EAGLE-3 head alone accepts" in shown[3]


def test_the_async_lesson_says_a_head_cannot_pre_draft(both: tuple[Atlas, Atlas]) -> None:
    from talon.figures.lessons import async_words
    from talon.lessons.asynchrony import async_lesson

    head, model = both
    lesson = async_lesson(head)
    assert lesson.reads_features and lesson.host.gain == lesson.gpu.gain == 1.0
    assert "cannot draft the next tree while the target verifies" in async_words(lesson)
    drafted = async_lesson(model)
    assert not drafted.reads_features and drafted.host.overlap_s > 0
    assert "cannot draft" not in async_words(drafted)
