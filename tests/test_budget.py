"""The model-free limit and budget (``talon.atlas.budget``): a call past the limit is refused at once, a
call past its budget is stopped, a call yields to a model run, and the app's light handlers are
held to it."""

from __future__ import annotations

import threading
import time

import pytest

from talon.atlas.budget import Busy, LightGate, OverBudget


def spin(gate: LightGate, seconds: float) -> int:
    """Work for ``seconds`` of wall time through ``gate``'s checkpoints; the checkpoints passed."""
    end, passed = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        sum(range(2000))
        gate.checkpoint()
        passed += 1
    return passed


def test_a_call_past_the_limit_is_refused_at_once_and_the_slot_comes_back() -> None:
    gate = LightGate(limit=1, cpu_s=5)
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with gate.call("holding"):
            inside.set()
            release.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(5)
    start = time.monotonic()
    with pytest.raises(Busy, match="busy: 1 model-free call"), gate.call("one more"):
        pass
    assert time.monotonic() - start < 0.1, "refused at once, not after a wait"
    assert gate.refused == 1
    release.set()
    holder.join(5)
    with gate.call("after"):  # the slot came back
        pass


def test_nested_calls_share_the_outer_slot() -> None:
    gate = LightGate(limit=1, cpu_s=5)
    with gate.call("outer"), gate.call("inner"):
        pass
    assert gate.refused == 0


def test_a_call_past_its_cpu_budget_is_stopped_and_checkpoints_outside_a_call_do_nothing() -> None:
    gate = LightGate(limit=1, cpu_s=0.2)
    spin(gate, 0.3)  # outside a call: no budget
    start = time.monotonic()
    with pytest.raises(OverBudget, match="ran past its budget"), gate.call("replaying"):
        spin(gate, 5.0)
    assert time.monotonic() - start < 1.5
    with gate.call("next"):  # the stopped call freed its slot
        pass


def test_a_call_keeps_its_share_of_the_time_while_a_model_runs() -> None:
    """The share is what the call's checkpoints leave it: a tenth of the wall time here while a
    model runs (work a slice, then nine times as long asleep), half of it otherwise."""
    gate = LightGate(limit=1, cpu_s=30, share=0.1)
    with gate.call("alone"):
        cpu0 = time.thread_time()
        spin(gate, 1.0)
        alone = time.thread_time() - cpu0
    with gate.model_work(), gate.call("beside a run"):
        cpu0 = time.thread_time()
        spin(gate, 1.0)
        beside = time.thread_time() - cpu0
    assert gate.models_running == 0
    assert alone <= 0.6, f"{alone:.2f} s of CPU in 1 s with no run: more than half"
    assert beside < 0.15, f"{beside:.2f} s of CPU in 1 s beside a run: more than its share"
    assert alone > 2.5 * beside, (alone, beside)


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError):
        LightGate(limit=0, cpu_s=1)
    with pytest.raises(ValueError):
        LightGate(limit=1, cpu_s=1, share=0)


def test_every_public_endpoint_that_runs_no_model_is_held_to_the_limit() -> None:
    """The layout refuses to build otherwise; the endpoints an anonymous caller reaches carry it."""
    from talon.settings import Settings
    from talon.ui.layout import build_ui

    fns = list(build_ui(Settings()).fns.values())
    light = {fn.api_name: fn.fn.bounded for fn in fns if not fn.queue and fn.api_visibility == "public"}
    assert set(light) == {"replay", "load_atlas", "load_sweep", "serving_config"}
    assert all(light.values()), light
    heavy = {"upload_atlas", "rescore", "choose_rule", "to_best", "apply", "show", "export", "compare_head",
             "compare_mtp", "translate", "load_sweep", "replay"}
    assert heavy <= {fn.name for fn in fns if getattr(fn.fn, "bounded", None)}
