"""The door of the public model-free endpoints' plain HTTP route (``POST /gradio_api/run/NAME``):
an ASGI middleware that lets in at most ``talon.atlas.budget.GATE.limit`` of their calls at a time and
refuses the rest with HTTP 429 and a clear message, before Gradio does any work for them.

Gradio answers a call without a session by building a fresh session state, the config of every
component on the page: about 50 ms of the interpreter on this app, before any handler runs. A
refusal inside the handler therefore still costs that much, and sixteen callers retrying in a
loop held the interpreter for most of the time (a visitor's run went from 400 to 3 tokens a
second). Refused here, a call costs well under a millisecond; the refusal answers after
``REFUSAL_DELAY_S``, without holding a thread, so a caller retrying at once retries once a
second."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from starlette.middleware import Middleware

from talon.atlas.budget import GATE

REFUSAL_DELAY_S = 1.0

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class LightDoor:
    """ASGI middleware: ``paths`` (the light endpoints' routes) admitted ``GATE.limit`` at a time."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], paths: Iterable[str]) -> None:
        self.app, self.paths = app, frozenset(p.rstrip("/") for p in paths)
        self._lock = threading.Lock()
        self.inside = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope["path"].rstrip("/") not in self.paths:
            await self.app(scope, receive, send)
            return
        with self._lock:
            admitted = self.inside < GATE.limit
            self.inside += admitted
        if not admitted:
            message = str(GATE.busy())
            await asyncio.sleep(REFUSAL_DELAY_S)
            await send({"type": "http.response.start", "status": 429,
                        "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1")]})
            await send({"type": "http.response.body", "body": json.dumps({"error": message}).encode()})
            return
        try:
            await self.app(scope, receive, send)
        finally:
            with self._lock:
                self.inside -= 1


def light_door(demo: Any) -> list[Middleware]:
    """The door for ``demo``'s public model-free endpoints, as ``launch(app_kwargs={"middleware": ...})``
    takes it: their plain HTTP routes and those routes' ``/api/`` aliases."""
    names = [fn.api_name for fn in demo.fns.values()
             if not fn.queue and fn.api_visibility == "public" and getattr(fn.fn, "bounded", None)]
    return [Middleware(LightDoor, paths=[f"/gradio_api/{route}/{name}" for name in names for route in ("run", "api")])]
