"""When a running decode's next UI update is due: the streaming throttle shared by the tabs."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from talon.trace import StepTrace

# Streaming throttle: the browser re-draws every figure it receives, which on a small laptop
# costs more than a decoding step. Text, tree and summary stream at most twice a second; the
# other figures every few seconds, and all of them at the end.
LIGHT_UPDATE_S = 0.5
FULL_UPDATE_S = 3.0


def stream_run(run: Iterable[StepTrace], on_step: Callable[[StepTrace], None]) -> Iterator[bool]:
    """Iterate a run, calling ``on_step``; yields when a UI update is due: True for a full
    update (every figure), False for a light one (text, tree, summary)."""
    last = last_full = -math.inf
    for step in run:
        on_step(step)
        now = time.perf_counter()
        if now - last_full >= FULL_UPDATE_S:
            last = last_full = now
            yield True
        elif now - last >= LIGHT_UPDATE_S:
            last = now
            yield False


def run_variants(
    runs: Sequence[Iterable[StepTrace]],
) -> Iterator[tuple[int, list[StepTrace], bool]]:
    """Run several already validated runs of one prompt in turn (Compare's A and B, the sweep's
    cells): yields ``(index, steps so far, finished)`` after each streamed update of run
    ``index`` and once more when it ends."""
    for index, run in enumerate(runs):
        steps: list[StepTrace] = []
        for _ in stream_run(run, steps.append):
            yield index, steps, False
        yield index, steps, True
