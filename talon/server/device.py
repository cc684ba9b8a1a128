"""The device call: one call (one ZeroGPU reservation, ``talon.models.zerogpu``) runs a user action's
jobs in turn (``decode_on_device``), sized by ``gpu_seconds``, taking and yielding only picklable
values; what it learned (the pair's refined cost curves) comes back as plain data (``Learned``)
and is adopted in the server process. A run's Stop flag reaches it through ``CANCELS``. A user
action (a decode with its baseline, a Compare, a sweep: ``DeviceAction``) has its runs validated
when it is made (``talon.server.request``), then runs them in one device call whose stream they
share: run i+1 starts where run i ends, Stop ends the call. Recording a prompt's draft atlas
(``record_on_device``) is a device call of its own."""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from talon.atlas.budget import GATE
from talon.atlas.data import Atlas
from talon.atlas.record import record_atlas
from talon.cost.model import CostModel
from talon.models import zerogpu
from talon.run_config import RunConfig
from talon.server import pair as pairs
from talon.server.controls import RunRequest, user_error
from talon.server.offer import find_preset
from talon.server.pair import held_key, out_of_memory_as_error, pair_key
from talon.server.presets import ModelPreset
from talon.server.request import Job, open_run, validate
from talon.settings import PairKey, Settings
from talon.trace import RunSummary, StepTrace

logger = logging.getLogger(__name__)


class CancelRegistry:
    """The Stop flags of the actions running now, by id. ``decode_on_device`` takes the id, not
    the Event: on ZeroGPU its arguments are pickled into a GPU worker process, where the id finds
    nothing and the call ends when its stream is closed (``DeviceAction._stream``)."""

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


on_gpu = zerogpu.gpu  # spaces.GPU(duration=...) where spaces is importable; see talon.models.zerogpu


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
    return min(GPU_MAX_S, math.ceil(_fixed_s(settings, jobs) + GPU_PER_TOKEN_S * tokens))


def _fixed_s(settings: Settings, jobs: list[Job]) -> float:
    """The reservation's part that does not grow with tokens: the start, and a load if needed."""
    return GPU_BASE_S + GPU_LOAD_S * any(pair_key(settings, job.preset) != held_key() for job in jobs)


def check_reservation(settings: Settings, jobs: list[Job], seconds: int, per_token: int = 1) -> None:
    """On ZeroGPU, refuse before the call an action whose reservation (``seconds``) exceeds what a
    visitor can be granted (TALON_ZEROGPU_MAX_S), saying what it needs and what would fit
    (``per_token``: token costs per new token, 2 for a recording's run and its draft forwards)."""
    cap = settings.zerogpu_max_s
    if not zerogpu.active() or seconds <= cap:
        return
    tokens = sum(job.cfg.max_new_tokens for job in jobs)
    fixed = _fixed_s(settings, jobs)
    fits = max(0, math.floor((cap - fixed) / GPU_PER_TOKEN_S / per_token / len(jobs)))
    raise user_error(
        f"this run would reserve about {seconds} s of GPU ({fixed:.0f} s to start, {GPU_PER_TOKEN_S:g} s for each "
        f"of {per_token * tokens} token steps over {len(jobs)} run{'s' if len(jobs) > 1 else ''}), more than the "
        f"{cap} s a visitor can be granted here (TALON_ZEROGPU_MAX_S; a free account's daily quota is 3.5 "
        f"minutes). Ask for at most {fits} new tokens" + (" per run, or for fewer runs (the baseline, Compare's B, "
                                                           "a sweep's cells)." if len(jobs) > 1 else "."))


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


class DeviceAction:
    """One user action (a decode with its baseline, a Compare, a sweep): its runs validated when
    it is made, so every error a user can fix is raised before any output changes; then run in
    one ``decode_on_device`` call. ``runs[i]`` iterates run i's StepTraces (in order: run i+1
    starts where run i ends); ``runs[i].summary`` is set when it ends."""

    def __init__(self, settings: Settings, requests: list[RunRequest],
                 cancel: threading.Event) -> None:
        self.jobs = validate(settings, requests)  # validated once, the ids handed on
        check_reservation(settings, self.jobs, gpu_seconds(settings, self.jobs))
        self.settings, self.cancel = settings, cancel
        self.summaries: list[RunSummary | None] = [None] * len(self.jobs)
        self.runs = [ActionRun(self, i) for i in range(len(self.jobs))]
        self._items: Iterator[tuple[int, StepTrace | RunSummary]] | None = None

    @property
    def gpu_seconds(self) -> int:
        return gpu_seconds(self.settings, self.jobs)

    def steps(self, index: int) -> Iterator[StepTrace]:
        """Run ``index``'s steps, pulling the shared stream until its summary arrives."""
        if self._items is None:
            self._items = self._stream()
        try:
            for i, item in self._items:
                if isinstance(item, RunSummary):
                    self.summaries[i] = item
                    if i == len(self.jobs) - 1:
                        for _ in self._items:  # what the call learned; then the call is closed
                            pass
                    if i >= index:
                        return
                elif i == index:
                    yield item
        except GeneratorExit:  # the handler was closed (Stop, a closed page): end the device call too
            self._items.close()
            raise

    def finish(self) -> None:
        """Run whatever is left (a baseline after the streamed run), then close the device call."""
        for _ in self.steps(len(self.jobs)):
            pass

    def _stream(self) -> Iterator[tuple[int, StepTrace | RunSummary]]:
        cancel_id = CANCELS.add(self.cancel)
        items = decode_on_device(  # looked up at the call: ZeroGPU's wrapper replaces it
            self.settings, self.jobs, cancel_id)
        stop_seen = False
        with GATE.model_work():  # model-free calls yield to the run while it streams (talon.atlas.budget)
            try:
                for item in items:
                    if isinstance(item, Learned):
                        if zerogpu.active():  # elsewhere the call ran in this process: its engine has learned
                            adopt_learned(item)
                    elif isinstance(item[1], RunSummary):
                        yield item
                    elif stop_seen:  # a run that cannot see the flag (ZeroGPU worker) ends when closed
                        break
                    else:
                        stop_seen = self.cancel.is_set()
                        yield item
            finally:
                items.close()
                CANCELS.drop(cancel_id)


def pair_wait(settings: Settings, preset_key: str, cancel: threading.Event) -> Iterator[str]:
    """Before a run validates (which needs its pair): while that pair is loading (the start-up
    load, or another visitor's switch) or not yet held, a status line every half second, ending
    when it is held or Stop is pressed. The load runs in a thread, so Stop ends the wait (the
    load goes on and the pair stays for the next run). A preset this server refuses raises here;
    a failed load is reported by the run's own load. On ZeroGPU the GPU call loads: nothing here."""
    if zerogpu.active():
        return
    preset = find_preset(settings, preset_key)
    key = pair_key(settings, preset)
    loader = None
    if pairs.SLOT.loading is None and held_key() != key:
        loader = threading.Thread(target=_load_quietly, args=(settings, preset), daemon=True, name="talon-load")
        loader.start()
    start = time.monotonic()
    while not cancel.is_set() and (pairs.SLOT.loading is not None or (loader is not None and loader.is_alive())):
        loading = pairs.SLOT.loading or key
        yield (f"loading the models: {pairs.pair_words(loading)}, {time.monotonic() - start:.0f} s so far; "
               "the run starts when they are ready (Stop ends the wait)")
        cancel.wait(0.5)


def _load_quietly(settings: Settings, preset: ModelPreset) -> None:
    try:
        pairs.load_engine(settings, preset)
    except Exception as error:  # noqa: BLE001 - the run's own load reports it to the user
        logger.warning("loading %s for a waiting run failed: %s", preset.key, error)


class ActionRun:
    """Run ``index`` of a DeviceAction: iterate it for StepTraces; ``summary`` when it ended."""

    def __init__(self, action: DeviceAction, index: int) -> None:
        self.action, self.index = action, index
        self.preset, self.cfg = action.jobs[index].preset, action.jobs[index].cfg

    @property
    def summary(self) -> RunSummary | None:
        return self.action.summaries[self.index]

    def __iter__(self) -> Iterator[StepTrace]:
        return self.action.steps(self.index)


def record_seconds(settings: Settings, preset: ModelPreset, prompt: str, cfg: RunConfig) -> int:
    """GPU seconds to reserve for a recording: a run (and a load, where another pair is held) plus
    the draft's batched forwards."""
    run = gpu_seconds(settings, [Job(preset, prompt, cfg)])
    return min(GPU_MAX_S, math.ceil(run + GPU_PER_TOKEN_S * cfg.max_new_tokens))


@on_gpu(duration=record_seconds)
def record_on_device(
    settings: Settings, preset: ModelPreset, prompt: str, cfg: RunConfig
) -> Iterator[tuple[float, str] | Atlas]:
    """Record the atlas of ``prompt``: yields (fraction done, what is happening), then the Atlas.
    Takes and yields only picklable values (on ZeroGPU it runs in a GPU worker)."""
    events: queue.Queue[tuple[float, str] | Atlas | BaseException] = queue.Queue()

    def work() -> None:
        try:
            with out_of_memory_as_error(cfg), GATE.model_work():
                engine = pairs.load_engine(settings, preset)
                events.put(record_atlas(engine, prompt, cfg, progress=lambda f, what: events.put((f, what))))
        except BaseException as error:  # handed to the caller's thread, raised there
            events.put(error)

    threading.Thread(target=work, daemon=True, name="talon-atlas-record").start()
    while True:
        item = events.get()
        if isinstance(item, BaseException):
            raise item
        yield item
        if isinstance(item, Atlas):
            return
