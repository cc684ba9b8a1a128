"""The conversion cache's bookkeeping, free of torch: where converted checkpoints live
(``resolve_cache_dir``), the marker a finished conversion writes (``MARKER_FILE``, ``read_marker``,
``is_converted``) and the lock that lets one process convert a model at a time. The conversion
itself: ``talon.models.convert``."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from talon.settings import Settings

logger = logging.getLogger(__name__)

MARKER_FILE = "talon-converted.json"


def read_marker(out_dir: Path) -> dict | None:
    try:
        return json.loads((out_dir / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None


def is_converted(out_dir: Path, source_sha256: str) -> bool:
    marker = read_marker(out_dir)
    return marker is not None and marker.get("source_sha256") == source_sha256


@contextlib.contextmanager
def conversion_lock(lock_path: Path) -> Iterator[None]:
    """Hold a file lock so that only one process converts a given model at a time."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=1)
    except Timeout:
        logger.info("Another process is converting this model (lock %s); waiting for it", lock_path)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir is not None else Settings.from_env().cache_dir
