"""The guided walk: a card that stays in view while it points at one figure after another
(``talon.figures.walk``), with Back / Next / Leave; and the offer to repeat a run with
cost-aware planning off when the planner skipped the draft model on most steps. Neither needs a
model: the walk reads the traces on screen (the recording at first)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from talon import figures as F
from talon.ui.session import Session


@dataclass
class WalkView:
    start: gr.Button
    panel: gr.Column  # the card and its buttons, hidden until the walk starts
    card: gr.HTML
    back: gr.Button
    next: gr.Button
    leave: gr.Button
    stop: gr.State  # the stop on screen (int), per browser session


def walk_panel() -> WalkView:
    """The walk's components (call inside the Decode tab)."""
    start = gr.Button(f"New here? Walk me through this step ({len(F.WALK)} stops, no model needed)", size="md",
                      variant="primary", elem_id="talon-walk-start")
    with gr.Column(visible=False, elem_id="talon-walk") as panel:
        card = gr.HTML("", elem_id="talon-walk-card")
        with gr.Row():
            back = gr.Button("◀ Back", size="sm", min_width=60, elem_id="talon-walk-back")
            nxt = gr.Button("Next ▶", size="sm", min_width=60, variant="primary", elem_id="talon-walk-next")
            leave = gr.Button("Leave ✕", size="sm", min_width=60, elem_id="talon-walk-leave")
    return WalkView(start=start, panel=panel, card=card, back=back, next=nxt, leave=leave, stop=gr.State(0))


def make_walk_to(view: WalkView, delta: int | None) -> Callable[[int, Session], dict[Any, Any]]:
    """A handler that moves the walk: ``None`` starts it at the first stop, +1/-1 steps it (Next on
    the last stop ends it)."""

    def walk_to(stop: int, session: Session) -> dict[Any, Any]:
        stop = 0 if delta is None else int(stop or 0) + delta
        if stop >= len(F.WALK) or not session.steps:
            return leave_walk(view)
        stop = max(stop, 0)
        index = session.clamp(session.shown)
        return {
            view.panel: gr.update(visible=True),
            view.card: F.walk_html(stop, session.summary, session.steps, index),
            view.stop: stop,
            view.next: gr.update(value="Done ✓" if stop == len(F.WALK) - 1 else "Next ▶"),
            view.back: gr.update(interactive=stop > 0),
        }

    return walk_to


def leave_walk(view: WalkView) -> dict[Any, Any]:
    return {view.panel: gr.update(visible=False), view.card: "", view.stop: 0}


def wire_walk(view: WalkView, state: gr.State) -> None:
    """Start, Next, Back and Leave; ``state`` is the Decode tab's Session."""
    outputs = [view.panel, view.card, view.stop, view.next, view.back]
    quick = dict(concurrency_limit=None, show_progress="hidden", api_visibility="private")
    view.start.click(make_walk_to(view, None), [view.stop, state], outputs, **quick)
    view.next.click(make_walk_to(view, +1), [view.stop, state], outputs, **quick)
    view.back.click(make_walk_to(view, -1), [view.stop, state], outputs, **quick)
    view.leave.click(lambda: leave_walk(view), None, outputs, **quick)


FULL_TREE_LABEL = "Show the full TALON tree (cost-aware planning off; slower here)"


def full_tree_button() -> gr.Button:
    return gr.Button(FULL_TREE_LABEL, visible=False, size="sm", variant="secondary", elem_id="talon-full-tree")


def make_offer_full_tree(button: gr.Button) -> Callable[[Session], dict[Any, Any]]:
    def offer(session: Session) -> dict[Any, Any]:
        """Offer the re-run only after a run whose draft model was skipped on most steps."""
        return {button: gr.update(visible=F.model_skipped_most(session.summary, session.steps))}

    return offer
