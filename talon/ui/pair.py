"""The one model pair a server holds, and switching it safely.

A GPU has room for one 7-8B pair. Switching presets therefore releases the pair held now (and
empties CUDA's cache) *before* the next one loads, and the memory guard then sees only what is
really free. A load that fails (a wrong id, a gated repo, out of memory) never leaves the server
empty-handed: the previous pair is loaded again, or failing that the start-up pair, and the error
says both what failed and what the server holds now.

Everything that touches a device comes in as a function (``build``, ``release``, ``free_bytes``),
so the order of loads and releases and the bytes the guard saw are tested with fakes on a CPU.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from talon.engine import PairKey
from talon.models import ModelLoadError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Held:
    key: PairKey
    engine: Any  # talon.decode.Engine (a fake in tests)


def is_out_of_memory(error: BaseException) -> bool:
    """A device (or host) allocation failure: torch's OutOfMemoryError or a RuntimeError saying so."""
    text = str(error).lower()
    return isinstance(error, torch.cuda.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)
    )


class PairSlot:
    """Holds at most one engine. ``get(key, guard, fallback)`` returns the engine for ``key``,
    switching to it if another pair is held. ``guard(free_bytes)`` is called after the release
    with the bytes really free (None where the device cannot say, e.g. a CPU) and raises
    ModelLoadError when the pair would not fit. ``fallback`` is the start-up pair's key."""

    def __init__(
        self,
        build: Callable[[PairKey], Any],
        release: Callable[[], None],
        free_bytes: Callable[[str], int | None],
    ) -> None:
        self._build, self._release, self._free_bytes = build, release, free_bytes
        self._lock = threading.Lock()  # loads are serialised: one pair on the device at a time
        self.held: Held | None = None

    def get(self, key: PairKey, guard: Callable[[int | None], None] | None = None,
            fallback: PairKey | None = None) -> Any:
        with self._lock:
            if self.held is not None and self.held.key == key:
                return self.held.engine
            previous = self.held.key if self.held is not None else None
            try:
                return self._switch(key, guard)
            except (ModelLoadError, OSError) as error:
                holds = self._recover([k for k in (previous, fallback) if k is not None and k != key])
                raise ModelLoadError(f"{error} {holds}") from error

    def drop(self) -> None:
        """Release the pair held now (its weights, then the device's cache)."""
        held, self.held = self.held, None
        if held is not None:
            log.info("releasing %s", held.key.describe())
            del held
            self._release()

    def _switch(self, key: PairKey, guard: Callable[[int | None], None] | None) -> Any:
        self.drop()
        if guard is not None:
            guard(self._free_bytes(key.device))
        try:
            engine = self._build(key)
        except RuntimeError as error:
            if not is_out_of_memory(error):
                raise
            self._release()
            raise ModelLoadError(f"{key.describe()} did not fit in the device's memory while loading ({error}).") from None
        self.held = Held(key, engine)
        log.info("holding %s", key.describe())
        return engine

    def _recover(self, candidates: list[PairKey]) -> str:
        """Load the first candidate that loads; the sentence that says what the server holds."""
        self.drop()
        for key in candidates:
            try:
                self._switch(key, None)
                return f"The server is back on {key.describe()}."
            except (ModelLoadError, OSError, RuntimeError) as error:
                log.error("could not load %s again: %s", key.describe(), error)
                self.drop()
        return "The server holds no model pair now; pick a preset to load one."
