"""The Lessons' exercises and calibration: answers decided by replays of each prompt, not by the
text; acceptance binned by path confidence from the adaptive tree's own traces."""

from __future__ import annotations

import dataclasses
import re

import pytest

from talon.atlas.replay import replay
from talon.figures.lessons import adaptive_words, calibration_figure, calibration_words, exercises_html
from talon.lessons import exercises as E
from talon.lessons.adaptive import AdaptiveLesson, adaptive_config, by_confidence, calibration
from talon.lessons.hybrid import HybridLesson
from talon.ui.lessons_tab import adaptive_lessons, lesson_atlases

STATIC = {d: 2.0 for d in range(1, 9)}


def _lesson(mat: float, budget: int, rate: float = 0.0) -> AdaptiveLesson:
    return AdaptiveLesson("qa", "p", budget, STATIC, 2.0, mat, adaptive_rate=rate)


def test_the_budget_and_retrieval_answers_follow_the_numbers() -> None:
    small = _lesson(2.0, 16)
    answers = [E.budget_exercise(small, _lesson(m, 59)) for m in (2.1, 2.4, 3.0)]
    assert [a.right for a in answers] == [0, 1, 2]
    assert "2.00 to 3.00 (+50 %)" in answers[2].answer
    mats = [{"model": 2.0, "retrieval": 1.0, "hybrid": h} for h in (2.3, 2.02, 1.7)]
    retrieval = [E.retrieval_exercise(HybridLesson("qa", "p", m, {})) for m in mats]
    assert [r.right for r in retrieval] == [0, 1, 2]


@pytest.fixture(scope="module")
def lessons() -> tuple:
    atlases = lesson_atlases()
    assert atlases, "the lesson atlases ship with the app"
    return atlases, adaptive_lessons(16), adaptive_lessons(59)


def test_the_gate_answer_is_a_replay_and_differs_by_prompt(lessons, monkeypatch) -> None:
    atlases, small, _ = lessons
    answers = [E.mu_exercise(a, 16) for a in atlases]
    assert len({a.right for a in answers}) >= 2, "the prompts answer differently: the data decides"
    for a, atlas in zip(answers, atlases):
        depth = [float(x) for x in re.findall(r"deepest layer goes from ([\d.]+) to ([\d.]+)", a.answer)[0]]
        width = [float(x) for x in re.findall(r"widest layer from ([\d.]+) to ([\d.]+)", a.answer)[0]]
        deeper, wider = depth[1] - depth[0], width[1] - width[0]
        if a.right == 0:
            assert deeper > 0 and wider <= 0.05
        elif a.right == 1:
            assert wider > 0 and deeper <= 0.05
        assert E.WHY_MU[a.right] in a.answer
    base = adaptive_config(atlases[0], 16)
    assert f"{replay(atlases[0], base).mat:.2f} to" in answers[0].answer  # MAT before, from a replay
    monkeypatch.setattr(E, "HIGH_MU", base.tree.mu)  # no change: the same trees, "neither"
    assert E.mu_exercise(atlases[0], 16).right == 2


def test_exercises_render_as_questions_with_one_marked_answer(lessons) -> None:
    atlases, small, large = lessons
    from talon.lessons.hybrid import hybrid_lesson

    html = exercises_html(E.exercises(atlases[0], small[0], large[0], hybrid_lesson(atlases[0])))
    assert html.count('class="talon-predict"') == 3
    for box in html.split('class="talon-predict"')[1:]:
        assert re.findall(r'data-right="(\d)"', box).count("1") == 1
        assert '<div class="talon-answer" hidden>' in box


def test_acceptance_follows_confidence_on_the_lesson_prompts(lessons) -> None:
    atlases, small, _ = lessons
    bins = calibration(small)
    drafted = sum(d for _, d in bins.values())
    result = replay(atlases[0], adaptive_config(atlases[0], 16))
    one, kept = by_confidence(result)
    assert sum(one.values()) == sum(len(s.tokens) - 1 for s in result.steps)
    assert sum(kept.values()) == sum(len(s.accepted) - 1 for s in result.steps)
    assert drafted == sum(sum(x.drafted_by_conf.values()) for x in small)
    low, high = bins[0], bins[max(bins)]
    assert high[0] / high[1] > 0.7 > 0.2 > low[0] / low[1], "acceptance rises with confidence"
    sure = [bins[b] for b in bins if b >= 7]
    words = calibration_words(bins)
    assert f"accepted {100 * sum(a for a, _ in sure) / sum(d for _, d in sure):.0f} % of the nodes" in words
    assert len(calibration_figure(bins).data[1].x) == len(bins)


def test_the_dilemma_words_read_mat_and_time_apart() -> None:
    flat = _lesson(2.0, 16)
    timed = [dataclasses.replace(flat, static_rate={d: 10.0 - abs(d - best) for d in range(1, 9)},
                                 adaptive_rate=9.5) for best in (1, 8)]
    words = adaptive_words(timed[0], timed)
    assert "In MAT, then, no depth dilemma shows" in words
    assert "ranges over 1, 8" in words and "That is the depth dilemma" in words and "0.95x to 0.95x" in words
    even = [dataclasses.replace(flat, static_rate={d: 10.0 for d in range(1, 9)}, adaptive_rate=10.0)] * 2
    assert "even in time" in adaptive_words(even[0], even)


def test_the_retrieval_figure_shows_the_match_it_drafted_from(lessons) -> None:
    from talon.figures.lessons import retrieval_html
    from talon.lessons.hybrid import hybrid_lesson, retrieval_example

    atlases = lessons[0]
    shown = 0
    for atlas in atlases:
        lesson = hybrid_lesson(atlas)
        example = retrieval_example(atlas, lesson)
        if example is None:
            assert not {"retrieval", "both"} & set(lesson.carried)
            assert "carried no step" in retrieval_html(None, str)
            continue
        shown += 1
        text = list(atlas.prompt_ids) + list(atlas.output)
        start = len(atlas.prompt_ids) + sum(len(t) for t in lesson.step_tokens[:example.step])
        n = len(example.match)
        assert text[start - n:start] == example.match, "the text so far ends with the match"
        assert text[example.earlier - n + 1:example.earlier + 1] == example.match, "and it occurred before"
        assert example.earlier < start - 1
        assert text[example.earlier + 1:example.earlier + 1 + len(example.proposed)] == example.proposed
        assert lesson.step_tokens[example.step][:example.kept] == example.proposed[:example.kept]
        assert lesson.carried[example.step] in ("retrieval", "both") and example.kept >= 1
        words = retrieval_html(example, lambda ids: "".join(atlas.text(t) for t in ids))
        assert f"the target kept {example.kept} of" in words and "longest end of the text" in words
    assert shown >= 3
