"""The door's rules on their own (``talon.ui.door``): whose turn it is, the credit that paces the
turns while a model runs, a turn given up when its response starts or after ``HOLD_S``, and which
event a request calls. The door on a real server, flooded, is ``tests/test_light_flood.py``."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import gradio as gr
import httpx
import pytest

from talon.atlas.budget import GATE
from talon.ui import door as D


def run(coroutine):  # noqa: ANN001, ANN201
    """``asyncio.run`` on a thread of its own (a browser test in this process may hold a loop)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def test_turns_go_in_order_and_the_lanes_take_turns() -> None:
    """Each lane in the order it came; while both wait, one from each in turn (a flood of queue
    entries, or of anything else, delays the other lane by one request at most)."""
    async def order() -> list[str]:
        turns, seen = D.Turns(), []
        assert await turns.take(1, 1)  # held

        async def wait(name: str, lane: int) -> None:
            assert await turns.take(lane, 5)
            seen.append(name)
            await asyncio.sleep(0)
            turns.give()

        tasks = []
        for name, lane in [("page 1", 1), ("page 2", 1), ("page 3", 1), ("run 1", 0), ("page 4", 1), ("run 2", 0)]:
            tasks.append(asyncio.create_task(wait(name, lane)))
            await asyncio.sleep(0.001)
        turns.give()
        await asyncio.gather(*tasks)
        assert not turns.busy
        return seen

    assert run(order()) == ["run 1", "page 1", "run 2", "page 2", "page 3", "page 4"]


def test_a_waiter_that_gives_up_passes_the_turn_on() -> None:
    async def handoff() -> tuple[bool, bool, bool]:
        turns = D.Turns()
        await turns.take(1, 1)
        late = asyncio.create_task(turns.take(1, 0.05))  # gives up before the turn is given
        left = asyncio.create_task(turns.take(1, 5))
        await asyncio.sleep(0.01)
        left.cancel()  # its client left
        patient = asyncio.create_task(turns.take(1, 5))
        await asyncio.sleep(0.1)
        turns.give()
        got = await asyncio.wait_for(patient, 1)
        return await late, got, turns.busy

    assert run(handoff()) == (False, True, True)


class Recorder:
    """An inner ASGI app: answers each request after ``work_s``, recording when it started."""

    def __init__(self, work_s: float, before_start_s: float = 0.0) -> None:
        self.work_s, self.before_start_s, self.started = work_s, before_start_s, []

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001
        self.started.append(time.monotonic())
        time.sleep(self.work_s)  # the interpreter's own work, as a handler's
        await asyncio.sleep(self.before_start_s)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def demo() -> gr.Blocks:
    with gr.Blocks() as blocks:
        box = gr.Textbox()
        box.submit(lambda text: text, box, box, api_name="echo")
    return blocks.queue()


async def gets(door: D.Door, n: int) -> list[int]:
    transport = httpx.ASGITransport(app=door)
    async with httpx.AsyncClient(transport=transport, base_url="http://door") as client:
        answers = await asyncio.gather(*(client.get("/config") for i in range(n)))
    return [a.status_code for a in answers]


def test_while_a_model_runs_the_turns_keep_to_their_share() -> None:
    """Six requests of 20 ms with the credit spent: each waits until the one before it has been
    paid for at ``SHARE`` of the clock; with no model running they go one after the other at once."""
    inner = Recorder(0.02)
    door = D.Door(inner, demo())
    door.credit = 0.0
    with GATE.model_work():
        assert run(gets(door, 6)) == [200] * 6
    gaps = [b - a for a, b in zip(inner.started, inner.started[1:])]
    assert min(gaps) >= (0.02 + D.REQUEST_S) / D.SHARE * 0.9, gaps
    inner.started.clear()
    door.credit = 0.0
    assert run(gets(door, 6)) == [200] * 6
    assert inner.started[-1] - inner.started[0] < 0.5, "no model runs: no pacing"
    assert door.credit == 0.0, "spent while no model runs: down to zero, never below"


def test_a_turn_is_given_up_after_hold_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request whose response does not start (a slow upload) holds the turn ``HOLD_S`` at most."""
    monkeypatch.setattr(D, "HOLD_S", 0.1)
    inner = Recorder(0.0, before_start_s=0.5)
    door = D.Door(inner, demo())
    assert run(gets(door, 2)) == [200, 200]
    assert 0.08 <= inner.started[1] - inner.started[0] < 0.4


def test_past_the_wait_a_request_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(D, "WAIT_S", 0.2)
    door = D.Door(Recorder(0.0), demo())
    door.credit = -1.0  # 20 s of turns owed at SHARE
    with GATE.model_work():
        assert run(gets(door, 1)) == [429]
    assert not door.turns.busy


def test_the_door_reads_the_event_as_gradio_does() -> None:
    blocks = demo()
    door = D.Door(Recorder(0.0), blocks)
    echo = next(fn for fn in blocks.fns.values() if fn.api_name == "echo")
    assert door.event("echo", b"{}") is echo
    assert door.event("anything", f'{{"fn_index": "{echo._id}"}}'.encode()) is echo
    assert door.event("anything", f'{{"fn_index": {echo._id}.0}}'.encode()) is echo
    assert door.event("echo", b'{"fn_index": 999}') is None
    assert door.event("echo", b"not json") is None
    assert D.is_page({"type": "http", "method": "GET", "path": "/"})
    assert not D.is_page({"type": "http", "method": "GET", "path": "/assets/index.js"})
    route = {"type": "http", "method": "POST"}
    assert D.event_route({**route, "path": "/gradio_api/run/predict"}) == ("run", "predict")
    assert D.event_route({**route, "path": "/gradio_api/call/v2/echo/"}) == ("call", "echo")
    assert D.event_route({**route, "path": "/gradio_api/queue/join"}) == ("queue", "")
    assert D.event_route({**route, "path": "/gradio_api/upload"}) is None
