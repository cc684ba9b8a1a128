"""Predict, then check: a question with a few answers as buttons, the verdict hidden until one is
pressed (``static/talon.js`` reveals it; the offline lesson file carries the same script). The
walk asks which path the target will keep; the Lessons' exercises ask what a knob will do, each
answered by a replay. While a walk question is open, the figures that would give the answer away
(the tree's colours, the text) are greyed and blurred (``static/talon.css``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Choice:
    label: str  # HTML (already escaped)
    right: bool


def predict_html(question: str, choices: Sequence[Choice], answer: str, *, hides_figures: bool = False) -> str:
    """``question`` and ``answer`` are HTML; ``answer`` opens with "Right" or "Not quite" once a
    choice is pressed. ``hides_figures``: grey the figures that show the verdict until then."""
    if not any(c.right for c in choices):
        raise ValueError("a question needs a right answer among its choices")
    buttons = "".join(f'<button type="button" class="talon-choice" data-right="{"1" if c.right else "0"}">'
                      f"{c.label}</button>" for c in choices)
    hide = " talon-hides" if hides_figures else ""
    return (f'<div class="talon-predict{hide}"><div class="talon-question">{question}</div>'
            f'<div class="talon-choices">{buttons}</div>'
            '<div class="talon-answer" hidden><b class="talon-right-word">Right.</b>'
            '<b class="talon-wrong-word">Not quite.</b> '
            f"{answer}</div></div>")
