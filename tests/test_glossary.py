"""Every term a newcomer meets is defined where it first appears in a text: the header, every
figure's explanation, every stop of the guided walk and the lessons' words (an ``<abbr>`` whose
title is the term's definition, ``talon.figures.glossary``)."""

from __future__ import annotations

import pytest

from talon import figures as F
from talon.ui.recording import load_recording
from talon.ui.words import EXPLAIN, HEADER


def test_the_header_and_every_explanation_define_their_terms() -> None:
    for name, text in {"header": HEADER, **EXPLAIN}.items():
        assert F.undefined(text) == set(), name


def test_every_walk_stop_defines_its_terms() -> None:
    recording = load_recording()
    assert recording is not None
    summary, steps = recording
    for stop in range(len(F.WALK)):
        for index in (0, len(steps) // 2):
            assert F.undefined(F.walk_html(stop, summary, list(steps), index)) == set(), (stop, index)


def test_the_lessons_words_define_their_terms() -> None:
    from talon.figures.lessons import adaptive_words, hybrid_words
    from talon.lessons.adaptive import AdaptiveLesson
    from talon.lessons.hybrid import HybridLesson

    lesson = AdaptiveLesson("qa", "p", 16, {d: 2.0 + d / 10 for d in range(1, 9)}, 2.5, 2.6, coverage=0.9)
    hybrid = HybridLesson("qa", "p", {"model": 2.0, "retrieval": 1.2, "hybrid": 2.1},
                          {"model": 9.0, "retrieval": 6.0, "hybrid": 9.5})
    for words in (adaptive_words(lesson, [lesson, lesson]), hybrid_words(hybrid)):
        assert F.undefined(F.define(F.esc(words))) == set()


@pytest.mark.parametrize("term", sorted(F.GLOSSARY))
def test_a_term_used_without_its_definition_is_caught(term: str) -> None:
    text = f"The run's {term} went up."
    assert F.undefined(text) == {term}
    defined = F.define(text)
    assert F.undefined(defined) == set() and defined.count("<abbr") == 1


def test_only_the_first_use_is_wrapped_and_tags_are_left_alone() -> None:
    text = '<span title="MAT">MAT</span> and MAT again'
    assert F.define(text) == ('<span title="MAT"><abbr title="' + F.esc(F.GLOSSARY["MAT"]).replace("'", "&#x27;")
                              + '">MAT</abbr></span> and MAT again')


SHOWN = F.LEAD_WORDS + 5  # "about 40": a lead ends at a sentence


def _texts() -> dict[str, str]:
    """Every explanation a newcomer reads: the header, the figures', the walk's, the lessons'."""
    from talon.ui.lessons_tab import make_show

    recording = load_recording()
    assert recording is not None
    summary, steps = recording
    texts = {"header": HEADER.split("</h1>")[1], **EXPLAIN, "rule": F.fold(F.RULE_WORDS)}  # the title aside
    for stop, walk in enumerate(F.WALK):
        if walk.key != "predict":  # a question and its answers, not an explanation
            for index in range(0, len(steps), 3):
                card = F.walk_html(stop, summary, list(steps), index)
                texts[f"walk {walk.key} step {index}"] = card.split('class="talon-walk-body">')[1]
    shown = make_show()(0, 16, None, None)
    for i in (0, 3, 6, 9):  # the adaptive, hybrid, async and calibration words
        texts[f"lesson words {i}"] = shown[i]
    return texts


def test_every_explanation_shows_about_forty_words_and_folds_the_rest() -> None:
    long = {name: F.words_shown(text) for name, text in _texts().items() if F.words_shown(text) > SHOWN}
    assert long == {}


def test_the_fold_keeps_the_lead_and_hides_the_rest() -> None:
    text = " ".join(f"Sentence {i} has exactly six words." for i in range(20))
    folded = F.fold(text)
    assert F.words_shown(folded) <= F.LEAD_WORDS and '<details class="talon-more">' in folded
    assert F.words_shown(text) == 120  # unfolded, all of it shows
    assert F.fold("One short sentence. And another.") == "One short sentence. And another."
    tagged = "<b>" + text + "</b>"
    assert F.fold(tagged) == tagged, "no split inside an element"
