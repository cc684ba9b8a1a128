"""Per-session data, kept in ``gr.State``: the traces of a browser session's run (``Session``)
and of its comparison (``CompareSession``), and ``stop``, which sets their Stop flags."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

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

    def begin(self, step_through: bool, cancel: threading.Event | None) -> None:
        """Forget the previous run; a new one starts (or a trace is replayed: no cancel)."""
        self.steps, self.summary, self.ar_summary, self.trace_path = [], None, None, None
        self.follow, self.step_through, self.shown = True, step_through, 0
        self.cancel = cancel

    def clamp(self, index: Any) -> int:
        try:
            value = int(index)
        except (TypeError, ValueError, OverflowError):
            value = 0
        return max(0, min(value, len(self.steps) - 1)) if self.steps else 0


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
