"""Model-free work's share of the host. Replaying an atlas, a trace or a sweep needs no model, so
anyone may call it, and on a small host a few such calls in a loop would take every core from the
visitors' runs. Three bounds keep them apart:

* **A limit** (``TALON_LIGHT_LIMIT``, default 1): at most that many model-free calls run at once
  in this process. One more is refused (``Busy``), never left waiting.
* **A budget per call**: ``TALON_LIGHT_CPU_S`` seconds of the call's own CPU time (default 20) and
  ten times that in wall time (``OverBudget``); the upload size is bounded where files are read
  (``talon.trace.MAX_UPLOAD_BYTES``). The app sets both from its settings (``GATE.configure``).
* **Model runs first**: while a model runs in this process (``model_work``), a model-free call
  keeps at most ``LIGHT_SHARE`` of the time: at each ``checkpoint`` it sleeps in proportion to
  the time it has just worked. The replays share the runs' interpreter (Python's one lock on the
  interpreter, the GIL), so a call that simply ran on would stall a run's every step, however
  few cores it took.

Work inside a call (the replay loops) calls ``checkpoint``; outside a call it costs nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

LIGHT_LIMIT = 1  # model-free calls at once (TALON_LIGHT_LIMIT)
LIGHT_CPU_S = 20.0  # CPU seconds one call may take (TALON_LIGHT_CPU_S)
LIGHT_SHARE = 0.05  # of the time, per call, while a model runs
IDLE_SHARE = 0.5  # of the time, while none runs: page loads, the slider and the queue need the interpreter too
SLICE_S = 0.002  # work between two sleeps: well under Python's switch interval (5 ms), so no one waits long on the GIL


class Busy(RuntimeError):
    """Refused at once: the limit's model-free calls are running."""


class OverBudget(RuntimeError):
    """A model-free call ran past its budget and was stopped."""


@dataclass
class Call:
    """One model-free call: what it does, its budget, and the clock of its last checkpoint."""

    what: str
    cpu_s: float
    wall_s: float
    started_cpu: float
    started_wall: float
    resumed: float  # when it last came back from a checkpoint (or started)


class LightGate:
    """The limit, the budget and the model runs' count of one process."""

    def __init__(self, limit: int = LIGHT_LIMIT, cpu_s: float = LIGHT_CPU_S, share: float = LIGHT_SHARE) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._runs = 0
        self._held = 0  # calls running now
        self.refused = 0  # calls turned away since start
        self.configure(limit, cpu_s, share)

    def configure(self, limit: int, cpu_s: float, share: float = LIGHT_SHARE) -> None:
        """Set the limit and the budget (at start-up, before any call)."""
        if limit < 1 or cpu_s <= 0 or not 0 < share <= 1:
            raise ValueError(f"a limit of 1 or more, a positive budget and a share in (0, 1]: {limit}, {cpu_s}, "
                             f"{share}")
        self.limit, self.cpu_s, self.share = limit, cpu_s, share

    @property
    def full(self) -> bool:
        """Whether a call made now would be refused."""
        with self._lock:
            return self._held >= self.limit

    def busy(self) -> Busy:
        """The refusal (counted)."""
        with self._lock:
            self.refused += 1
        return Busy(f"Talon is busy: {self.limit} model-free call{'s' if self.limit > 1 else ''} (atlas, trace or "
                    "sweep replays) are running now. Try again in a few seconds.")

    @contextmanager
    def call(self, what: str) -> Iterator[Call]:
        """One model-free call, or ``Busy`` at once. Calls nest (a handler calling a handler): the
        outer one holds the slot."""
        if getattr(self._local, "call", None) is not None:
            yield self._local.call
            return
        with self._lock:
            admitted = self._held < self.limit
            self._held += admitted
        if not admitted:
            raise self.busy()
        now = time.monotonic()
        call = Call(what, self.cpu_s, self.cpu_s * 10, time.thread_time(), now, now)
        self._local.call = call
        try:
            yield call
        finally:
            self._local.call = None
            with self._lock:
                self._held -= 1

    @contextmanager
    def model_work(self) -> Iterator[None]:
        """A model runs in this process while inside: model-free calls yield to it."""
        with self._lock:
            self._runs += 1
        try:
            yield
        finally:
            with self._lock:
                self._runs -= 1

    @property
    def models_running(self) -> int:
        with self._lock:
            return self._runs

    def checkpoint(self) -> None:
        """Inside a call: stop it past its budget, and after each slice of work, sleep so that the
        call keeps at most its share of the time (``share`` while a model runs, ``IDLE_SHARE``
        otherwise: the server's own requests need the interpreter too). Outside a call: nothing."""
        call = getattr(self._local, "call", None)
        if call is None:
            return
        now = time.monotonic()
        worked = now - call.resumed
        if worked < SLICE_S:
            return
        if time.thread_time() - call.started_cpu > call.cpu_s or now - call.started_wall > call.wall_s:
            raise OverBudget(f"{call.what} ran past its budget ({call.cpu_s:g} s of CPU, {call.wall_s:g} s in all) "
                             "and was stopped: try a smaller file")
        share = self.share if self.models_running else IDLE_SHARE
        time.sleep(min(worked * (1 / share - 1), 5.0))
        call.resumed = time.monotonic()


GATE = LightGate()  # this process's


def checkpoint() -> None:
    """``GATE.checkpoint``: the replay loops call it."""
    GATE.checkpoint()
