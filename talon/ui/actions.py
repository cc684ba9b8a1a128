"""A user action (a decode with its baseline, a Compare, a sweep): its runs validated when it is
made (``talon.ui.request``), then run in one device call (``talon.ui.device``) whose stream the
action's runs share: run i+1 starts where run i ends, Stop ends the call."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from talon import zerogpu
from talon.settings import Settings
from talon.trace import RunSummary, StepTrace
from talon.ui.controls import Controls
from talon.ui import device
from talon.ui.device import CANCELS, Learned, adopt_learned, gpu_seconds
from talon.ui.request import Job, check_job, plan_run


class DeviceAction:
    """One user action (a decode with its baseline, a Compare, a sweep): its runs validated when
    it is made, so every error a user can fix is raised before any output changes; then run in
    one ``decode_on_device`` call. ``runs[i]`` iterates run i's StepTraces (in order: run i+1
    starts where run i ends); ``runs[i].summary`` is set when it ends."""

    def __init__(self, settings: Settings, requests: list[tuple[str, Controls, dict[str, Any]]],
                 cancel: threading.Event) -> None:
        self.jobs = []
        for prompt, controls, overrides in requests:
            preset, cfg = plan_run(settings, prompt, controls, **overrides)
            self.jobs.append(Job(preset, prompt, cfg))
        self.jobs = [check_job(settings, job) for job in self.jobs]  # validated once, the ids handed on
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
        items = device.decode_on_device(  # looked up at the call: ZeroGPU's wrapper replaces it
            self.settings, self.jobs, cancel_id)
        stop_seen = False
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


def start_status(action: DeviceAction) -> str:
    """The status line while an action starts: on ZeroGPU it first waits for a GPU slot."""
    return zerogpu.waiting_note(action.gpu_seconds) if zerogpu.active() else "running…"


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


def DeviceRun(settings: Settings, prompt: str, controls: Controls, cancel: threading.Event,  # noqa: N802
              **overrides: Any) -> ActionRun:
    """A user action of one run (validated now): iterate it for StepTraces; ``summary`` at the end."""
    return DeviceAction(settings, [(prompt, controls, overrides)], cancel).runs[0]
