"""Per-session data, kept in ``gr.State``: the traces of a browser session's run (``Session``)
and of its comparison (``CompareSession``), ``stop``, which sets their Stop flags,
``sessionless``, a handler as an API endpoint with a fresh state per call, and ``bounded``, a
handler that runs no model held to the model-free limit and budget (``talon.atlas.budget``)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import gradio as gr

from talon.atlas.budget import GATE, Busy, OverBudget
from talon.trace import RunSummary, StepTrace


@dataclass
class Session:
    """One browser session's run: the traces every figure is re-plotted from.

    ``cancel`` is created per run (never deep-copied: the initial State value has none);
    ``follow`` is False once the user scrubs, so streaming stops moving the step view."""

    steps: list[StepTrace] = field(default_factory=list)
    summary: RunSummary | None = None
    ar_summary: RunSummary | None = None
    cancel: threading.Event | None = None
    follow: bool = True
    step_through: bool = False
    shown: int = 0
    trace_path: str | None = None
    # what the stream last sent to each output (component id -> fingerprint), so an unchanged
    # output is not sent again; forgotten whenever another handler redraws the view
    sent: dict[int, str] = field(default_factory=dict)
    payload: list[tuple[int, int]] = field(default_factory=list)  # (bytes computed, bytes sent) per update

    def begin(self, step_through: bool, cancel: threading.Event | None) -> None:
        """Forget the previous run; a new one starts (or a trace is replayed: no cancel)."""
        self.steps, self.summary, self.ar_summary, self.trace_path = [], None, None, None
        self.follow, self.step_through, self.shown = True, step_through, 0
        self.cancel = cancel
        self.sent, self.payload = {}, []

    def unsent(self, updates: dict[Any, Any]) -> dict[Any, Any]:
        """``updates`` without the outputs whose value is what this stream last sent them;
        records the bytes of both (``payload``)."""
        fresh: dict[Any, Any] = {}
        computed = sent = 0
        for component, value in updates.items():
            if isinstance(component, gr.State):  # server-side only: never sent to the browser
                fresh[component] = value
                continue
            text = fingerprint(value)
            computed += len(text)
            if self.sent.get(id(component)) == text:
                continue
            self.sent[id(component)] = text
            sent += len(text)
            fresh[component] = value
        self.payload.append((computed, sent))
        return fresh

    def clamp(self, index: Any) -> int:
        try:
            value = int(index)
        except (TypeError, ValueError, OverflowError):
            value = 0
        return max(0, min(value, len(self.steps) - 1)) if self.steps else 0


def fingerprint(value: Any) -> str:
    """The serialised form of an output's value, as near as cheaply possible to what is sent:
    a Plotly figure's JSON, an HTML string, the repr of anything else (updates, paths, State)."""
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        return to_json()
    return value if isinstance(value, str) else repr(value)


@dataclass
class CompareSession:
    runs: list[tuple[str, list[StepTrace]]] = field(default_factory=list)
    summaries: list[RunSummary | None] = field(default_factory=list)
    cancel: threading.Event | None = None


def stop(session: Session, cmp: CompareSession | None = None) -> None:
    """Ask the running decode (and compare) to stop after the current step."""
    for cancel in (session.cancel, cmp.cancel if cmp else None):
        if cancel is not None:
            cancel.set()


def sessionless(handler: Callable[..., dict[Any, Any]], fresh: Callable[[], Any]) -> Callable[..., dict[Any, Any]]:
    """``handler`` (its page state the second argument) as an API endpoint that holds no session:
    each call gets a fresh ``fresh()`` state, and no ``gr.State`` is among its outputs, so the
    plain HTTP route (``POST /gradio_api/run/NAME``, which skips the queue) takes exactly the
    endpoint's documented parameters."""
    signature = inspect.signature(handler)
    params = list(signature.parameters.values())

    def call(first: Any, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        out = handler(first, fresh(), *args, **kwargs)
        return {k: v for k, v in out.items() if not isinstance(k, gr.State)}

    call.__signature__ = signature.replace(parameters=[params[0], *params[2:]])  # type: ignore[attr-defined]
    call.__doc__, call.__name__ = handler.__doc__, handler.__name__
    call.bounded = getattr(handler, "bounded", None)  # type: ignore[attr-defined]
    return call


class BusyError(gr.Error):
    """A model-free call refused because the limit's calls are running (``talon.atlas.budget.Busy``)."""


def bounded(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A handler that runs no model but may work for a while (an atlas, a trace or a sweep
    replayed), held to ``talon.atlas.budget.GATE``: refused past the limit (``BusyError``), stopped
    past its budget, yielding to model runs; the caller reads why. ``what`` names the work in the
    message."""

    def wrap(handler: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(handler)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                with GATE.call(what):
                    return handler(*args, **kwargs)
            except Busy as error:
                raise BusyError(str(error), print_exception=False) from None
            except OverBudget as error:
                raise gr.Error(str(error), print_exception=False) from None

        call.bounded = what  # type: ignore[attr-defined] - the layout checks every light endpoint has it
        return call

    return wrap


WAIT_FOR_SLOT_S = 60.0  # a page's own events overlap (the Lessons' first replays, an upload): they wait this long


def refused_slowly(handler: Callable[..., Any]) -> Callable[..., Any]:
    """``handler`` (``bounded``) as the server calls it: while the limit's calls run it waits for a
    slot without holding a thread, up to ``WAIT_FOR_SLOT_S`` (one page's events overlap: opening
    the Lessons while an upload replays), then is refused; so callers retrying in a loop cannot make
    the refusals themselves the load (each request costs the server a few milliseconds of the
    interpreter before any handler runs). The public endpoints' plain route is refused sooner, at
    its door (``talon.ui.door``). With a slot free, the handler runs in a worker thread, as Gradio
    runs any other."""

    @functools.wraps(handler)
    async def front(*args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + WAIT_FOR_SLOT_S
        while True:
            while GATE.full and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if GATE.full:
                raise BusyError(str(GATE.busy()), print_exception=False)
            try:
                return await anyio.to_thread.run_sync(functools.partial(handler, *args, **kwargs))
            except BusyError:  # another call took the free slot first
                if time.monotonic() >= deadline:
                    raise

    return front
