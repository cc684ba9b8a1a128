"""The device call: one call (one ZeroGPU reservation, ``talon.zerogpu``) runs a user action's
jobs in turn (``decode_on_device``), sized by ``gpu_seconds``, taking and yielding only picklable
values; what it learned (the pair's refined cost curves) comes back as plain data (``Learned``)
and is adopted in the server process. A run's Stop flag reaches it through ``CANCELS``."""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from talon import zerogpu
from talon.cost import CostModel
from talon.settings import Settings
from talon.trace import RunSummary, StepTrace
from talon.ui import models as pairs
from talon.ui.models import held_key, out_of_memory_as_error, pair_key
from talon.ui.pair import PairKey
from talon.ui.request import Job, open_run


class CancelRegistry:
    """The Stop flags of the actions running now, by id. ``decode_on_device`` takes the id, not
    the Event: on ZeroGPU its arguments are pickled into a GPU worker process, where the id finds
    nothing and the call ends when its stream is closed (``talon.ui.actions``)."""

    def __init__(self) -> None:
        self._flags: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def add(self, cancel: threading.Event) -> str:
        cancel_id = uuid.uuid4().hex
        with self._lock:
            self._flags[cancel_id] = cancel
        return cancel_id

    def get(self, cancel_id: str) -> threading.Event | None:
        with self._lock:
            return self._flags.get(cancel_id)

    def drop(self, cancel_id: str) -> None:
        with self._lock:
            self._flags.pop(cancel_id, None)

    def __len__(self) -> int:
        """Actions running now."""
        with self._lock:
            return len(self._flags)


CANCELS = CancelRegistry()  # this server process's running actions


# ZeroGPU reservation per user action: prefill and the cost probe, a pair's load when another pair
# is asked for, then a generous per-token cost, capped.
GPU_BASE_S = 20


GPU_LOAD_S = 60


GPU_PER_TOKEN_S = 0.1


GPU_MAX_S = 300


on_gpu = zerogpu.gpu  # spaces.GPU(duration=...) where spaces is importable; see talon.zerogpu


@dataclass(frozen=True)
class Learned:
    """What a device call learned, handed back as plain data (on ZeroGPU the call runs in a
    forked worker whose Python state never comes back): the pair's cost curves by draft vocabulary."""

    key: PairKey
    costs: dict[int, dict[str, Any]]


def gpu_seconds(settings: Settings, jobs: list[Job], cancel_id: str = "") -> int:
    """GPU seconds to reserve for one user action (same arguments as ``decode_on_device``): a base
    for prefill and the cost probe, a per-token cost of each run's max_new_tokens, and a load
    when a run needs a pair other than the one held, capped at GPU_MAX_S."""
    tokens = sum(job.cfg.max_new_tokens for job in jobs)
    load = any(pair_key(settings, job.preset) != held_key() for job in jobs)
    return min(GPU_MAX_S, math.ceil(GPU_BASE_S + GPU_LOAD_S * load + GPU_PER_TOKEN_S * tokens))


@on_gpu(duration=gpu_seconds)
def decode_on_device(
    settings: Settings, jobs: list[Job], cancel_id: str = ""
) -> Iterator[tuple[int, StepTrace | RunSummary] | Learned]:
    """Run a user action's jobs in turn, in one device call: yields ``(job index, StepTrace)``
    items, ``(job index, RunSummary)`` when a job ends, then what the call learned. Takes and
    yields only picklable values, and every failure a user can act on leaves it as a gr.Error."""
    cancel = CANCELS.get(cancel_id) or threading.Event()
    engine = None
    for index, job in enumerate(jobs):
        if cancel.is_set() and index > 0:  # stopped: the first run still ends with its summary
            break
        with out_of_memory_as_error(job.cfg):
            run = open_run(settings, job, cancel)
            engine = run.engine
            for step in run:
                yield index, step
        assert run.summary is not None
        if run.costs is not None and not run.fixed_costs and not cancel.is_set():
            if job.cfg.needs_draft_model or not job.cfg.uses_model:  # a view's curves stay its own
                engine.adopt_costs(run.costs, job.cfg.draft_vocab)  # learn mode: the next run starts from these
        yield index, run.summary
    if engine is not None:  # the last run's pair is the one held now
        yield Learned(pair_key(settings, job.preset), {v: c.to_dict() for v, c in engine.cost_snapshots().items()})


def adopt_learned(learned: Learned) -> None:
    """In the server process: keep what a device call learned for the pair held here (on ZeroGPU
    the next forked worker starts from it; elsewhere it is the same engine, and nothing changes)."""
    if pairs.SLOT.held is not None and pairs.SLOT.held.key == learned.key:
        for vocab, data in learned.costs.items():
            pairs.SLOT.held.engine.adopt_costs(CostModel.from_dict(data), vocab)
