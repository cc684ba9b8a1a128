"""``replay``: a configuration replayed over an atlas to the end of its text. This module imports
no torch: the explorer, the sweeps, the lessons and their figures import it, and the step loop
with the real drafter classes (``talon.atlas.loop``) loads on the first replay."""

from __future__ import annotations

from talon.atlas.budget import checkpoint
from talon.atlas.data import Atlas
from talon.atlas.result import ReplayResult
from talon.run_config import RunConfig


def replay(atlas: Atlas, cfg: RunConfig) -> ReplayResult:
    """Replay ``cfg`` over ``atlas`` to the end of its text (``talon.atlas.loop.replay_run``: the
    step loop and its parts, imported on the first replay)."""
    from talon.atlas.loop import replay_run

    run, coverage = replay_run(atlas, cfg)
    for _ in run:
        checkpoint()  # a step: within a model-free call, its budget and the runs' share (talon.atlas.budget)
    assert run.summary is not None
    return ReplayResult(run.summary, run.steps, coverage)
