"""The server's door: an ASGI middleware that sees every HTTP request before Gradio does any work
for it. A run shares this process's interpreter (and its one lock, the GIL) with everything the
server answers, and anyone may ask for anything, so the door holds Gradio's work to a bound:

* **Turns.** The page and its description (``PAGES``: ``/``, ``/config``, ``/gradio_api/info``,
  ...) and every call of an event (``/run/NAME``, ``/api/NAME``, ``/queue/join``, ``/call/NAME``)
  take their turn: one at a time, in the order they came (queue entries and the rest in two lanes
  that alternate, ``Turns``), each holding the turn until its
  response starts (at most ``HOLD_S``). While a model runs in this process, their time together
  is held to ``SHARE`` of the wall clock, with bursts of up to ``BURST_S`` (``Door.turn``); a
  request waits for its turn without holding a thread, up to ``WAIT_S``, then is refused (HTTP
  429). Each takes little (a step view about 10 ms, the page 60 ms, the recording a page opens
  with 70 ms), but sixteen callers asking for a step in a loop took a run from 0.3-0.8 s to
  8-10 s.
* **Events.** A call is read for which event it calls: the body's ``fn_index``, else the route's
  name, as Gradio reads it (``Door.event``); anyone may post any event, the page's private ones
  included.
  - A queue entry for an event that skips the queue and is not a model-free endpoint is refused
    (HTTP 403): the page never sends one, and in the queue it would run with no limit.
  - A public model-free endpoint (``/load_atlas``, ``/replay``, ...) takes no turn: it is let
    in at most ``talon.atlas.budget.GATE.limit`` at a time; the rest are refused with HTTP 429
    after ``REFUSAL_DELAY_S``, without holding a thread, so a caller retrying at once retries once
    a second. (Refused inside the handler, each call would still cost the 50 ms Gradio takes to
    build a fresh session state: sixteen callers in a loop took a run from 400 to 3 tokens a
    second.)
  - The page's model-free events that may work for a while (an upload replayed, the Lessons)
    take none either: their handlers wait for the model-free limit
    (``talon.ui.session.refused_slowly``).
  - A body over ``MAX_BODY_BYTES`` is refused (HTTP 413): files come by ``/upload``.
* **Files and streams pass**: the page's scripts, downloads, uploads, the queue's streams. Each
  costs the web server's own floor (1.2-1.7 ms of the interpreter), and paced, a visitor's page
  would load a request at a time beside every run. A flood of them is a proxy's to limit (16
  callers asking for ``robots.txt`` in a loop took a run from 270 to 40 tokens a second)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.middleware import Middleware

from talon.atlas.budget import GATE

SHARE = 0.05  # of the wall clock, the requests' turns together, while a model runs
BURST_S = 1.0  # of their time, at most, taken at once: a page load (0.2-0.7 s) after a quiet while
REQUEST_S = 0.002  # a request's cost outside its turn (probed: 1.2-1.7 ms of server CPU per request in all)
HOLD_S = 1.0  # the longest one request holds the turn (a slow upload goes on without it)
WAIT_S = 10.0  # the longest a request waits for its turn
REFUSAL_DELAY_S = 1.0
MAX_BODY_BYTES = 1024 * 1024  # an event's inputs (a prompt of 4,096 tokens: 64 KB at most)
GRADIO_API = "/gradio_api/"
DIRECT, QUEUED = ("run", "api"), ("queue", "call")
PAGES = frozenset({"/", "/config", "/gradio_api/info", "/gradio_api/openapi.json", "/gradio_api/runs"})

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

BUSY = "Talon is busy: too many requests are waiting while a run goes. Try again in a few seconds."


class Turns:
    """Whose turn it is: one request at a time, from two lanes, each in the order it came: queue
    entries (a visitor's Run) and the rest. While both have requests waiting they take turns, so a
    flood in one lane delays the other by one request at most."""

    def __init__(self) -> None:
        self.busy, self.last = False, 1
        self.lanes: tuple[deque[asyncio.Future], deque[asyncio.Future]] = (deque(), deque())

    async def take(self, lane: int, timeout: float) -> bool:
        """Wait for the turn in ``lane`` (0: queue entries, 1: the rest), up to ``timeout``; whether
        it was given."""
        if not self.busy:
            self.busy, self.last = True, lane
            return True
        handed = asyncio.get_running_loop().create_future()
        self.lanes[lane].append(handed)
        try:
            await asyncio.wait_for(handed, timeout)
            return True
        except TimeoutError:
            self.leave(handed)
            return False
        except asyncio.CancelledError:  # the client left
            self.leave(handed)
            raise

    def leave(self, handed: asyncio.Future) -> None:
        """A waiter gives up: if the turn was handed to it meanwhile, it goes to the next."""
        if handed.done() and not handed.cancelled():
            self.give()
        else:
            handed.cancel()

    def give(self) -> None:
        """The turn to the next request waiting, the other lane's first, or to none."""
        for lane in (1 - self.last, self.last):
            waiting = self.lanes[lane]
            while waiting:
                handed = waiting.popleft()
                if not handed.done():
                    handed.set_result(None)
                    self.last = lane
                    return
        self.busy = False


class Turn:
    """One request's turn: given up when its response starts, when it is handed to the model-free
    gate, or after ``HOLD_S``, whichever comes first; its time is then taken from the credit."""

    def __init__(self, door: Door) -> None:
        self.door, self.started, self.held = door, time.monotonic(), True
        self.timer = asyncio.get_running_loop().call_later(HOLD_S, self.give_up)

    def give_up(self) -> None:
        if not self.held:
            return
        self.held = False
        self.timer.cancel()
        self.door.spend(time.monotonic() - self.started + REQUEST_S)
        self.door.turns.give()


class Door:
    """ASGI middleware: every HTTP request to ``demo``'s server, held to its bound."""

    def __init__(self, app: App, demo: Any) -> None:
        self.app, self.fns = app, demo.fns
        self._lock = threading.Lock()
        self.inside = 0  # public model-free calls admitted
        self.turns = Turns()
        self.credit, self._filled = BURST_S, time.monotonic()  # seconds of turns (``fill``)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = event_route(scope) if scope["type"] == "http" else None
        if route is None and not (scope["type"] == "http" and is_page(scope)):
            await self.app(scope, receive, send)  # a file, a stream, an upload: the web server's own
            return
        fn = None
        if route is not None:
            body = await read_body(receive)
            if body is None:
                await answer(send, 413, f"A request to {scope['path']} carries at most {MAX_BODY_BYTES >> 20} MiB: "
                                        "files go by /gradio_api/upload.")
                return
            receive, fn = replayed(body, receive), self.event(route[1], body)
            if route[0] in DIRECT and fn is not None and is_bounded(fn):
                # model-free work: held by the model-free gate, not by the turns
                await (self.light if fn.api_visibility == "public" else self.app)(scope, receive, send)
                return
        turn = await self.turn(0 if route is not None and route[0] in QUEUED else 1)
        if turn is None:
            await answer(send, 429, BUSY)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                turn.give_up()
            await send(message)

        try:
            if route is not None and route[0] in QUEUED and not (fn is not None and (fn.queue or is_bounded(fn))):
                await answer(sending, 403, f"{fn.name if fn else 'This event'} does not take the queue: "
                                           "post it to /gradio_api/run/predict.")
            else:
                await self.app(scope, receive, sending)
        finally:
            turn.give_up()

    def event(self, name: str, body: bytes) -> Any:
        """The event a request calls, as Gradio finds it (``route_utils.get_fn``): the body's
        ``fn_index``, else the first event named ``name``; None where there is none."""
        try:
            data = json.loads(body or b"{}")
        except ValueError:
            return None
        index = data.get("fn_index") if isinstance(data, dict) else None
        if index is not None:
            return self.fns.get(as_index(index))
        return next((fn for fn in self.fns.values() if fn.api_name == name), None)

    def fill(self) -> float:
        """The credit now, in seconds of turns: it fills at ``SHARE`` a second, up to ``BURST_S``."""
        now = time.monotonic()
        self.credit = min(BURST_S, self.credit + (now - self._filled) * SHARE)
        self._filled = now
        return self.credit

    def spend(self, seconds: float) -> None:
        """A turn's time, taken from the credit; while no model runs, down to zero at most, so a
        flood before a run leaves it nothing to use, and a visitor's page costs a later run nothing."""
        left = self.fill() - seconds
        self.credit = left if GATE.models_running else max(left, 0.0)

    async def turn(self, lane: int) -> Turn | None:
        """This request's turn, once the requests before it have had theirs and, while a model
        runs, the credit is not below zero; None past ``WAIT_S``."""
        deadline = time.monotonic() + WAIT_S
        if not await self.turns.take(lane, WAIT_S):
            return None
        try:
            while GATE.models_running and (credit := self.fill()) < 0:
                if time.monotonic() - credit / SHARE > deadline:
                    self.turns.give()
                    return None
                await asyncio.sleep(-credit / SHARE)
        except asyncio.CancelledError:  # the client left while it waited for the credit
            self.turns.give()
            raise
        return Turn(self)

    async def light(self, scope: Scope, receive: Receive, send: Send) -> None:
        with self._lock:
            admitted = self.inside < GATE.limit
            self.inside += admitted
        if not admitted:
            message = str(GATE.busy())
            await asyncio.sleep(REFUSAL_DELAY_S)
            await answer(send, 429, message)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            with self._lock:
                self.inside -= 1


def is_bounded(fn: Any) -> bool:
    """Whether an event is model-free work held to the model-free gate (``talon.ui.session.bounded``)."""
    return bool(getattr(fn.fn, "bounded", None))


def as_index(value: Any) -> int | None:
    """``fn_index`` as Gradio's model reads it (pydantic's lax int: 9, 9.0, "9", True)."""
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        value = value.strip()
        return int(value) if value.lstrip("+-").isdigit() else None
    return int(value) if isinstance(value, int) else None


def is_page(scope: Scope) -> bool:
    """Whether a request asks for the page or its description (``PAGES``): each is built anew,
    15-60 ms."""
    return scope.get("method") in ("GET", "HEAD") and (scope["path"].rstrip("/") or "/") in PAGES


def event_route(scope: Scope) -> tuple[str, str] | None:
    """(kind, name) of a POST to a route that calls an event: ``run``/``api`` (the plain HTTP
    route, ``name`` the event's API name) or ``queue``/``call`` (a queue entry); else None."""
    path = scope["path"]
    if scope.get("method") != "POST" or not path.startswith(GRADIO_API):
        return None
    parts = path[len(GRADIO_API):].strip("/").split("/")
    if parts[0] in DIRECT and len(parts) == 2:
        return parts[0], parts[1]
    if parts == ["queue", "join"]:
        return "queue", ""
    if parts[0] == "call" and len(parts) in (2, 3):
        return "call", parts[-1]
    return None


async def read_body(receive: Receive) -> bytes | None:
    """The whole body, or None past ``MAX_BODY_BYTES`` (or when the client left)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def replayed(body: bytes, receive: Receive) -> Receive:
    """``receive`` with ``body`` given again first (the door read it): then the client's own
    messages (a disconnect)."""
    given = False

    async def again() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return again


async def answer(send: Send, status: int, message: str) -> None:
    headers = [(b"content-type", b"application/json")]
    if status == 429:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps({"error": message}).encode()})


def door_for(demo: Any) -> list[Middleware]:
    """The door for ``demo``'s server, as ``launch(app_kwargs={"middleware": ...})`` takes it."""
    return [Middleware(Door, demo=demo)]
