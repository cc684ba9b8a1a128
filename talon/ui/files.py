"""Files the app hands out and takes in: trace downloads written to a temporary folder that is
swept of old files, and the local path of an uploaded file (reading and checking what is in
it is ``talon.trace``'s job)."""

from __future__ import annotations

import contextlib
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from talon.trace import RunSummary, StepTrace, dump_trace

TRACE_DIR_NAME = "talon-traces"
TRACE_MAX_AGE_S = 3600


def trace_dir() -> Path:
    path = Path(tempfile.gettempdir()) / TRACE_DIR_NAME
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_trace(summary: RunSummary, steps: list[StepTrace]) -> str:
    """Write the run as a talon-trace/1 JSON file for download; old files are swept away."""
    folder = trace_dir()
    now = time.time()
    for old in folder.glob("talon-trace-*.json"):
        with contextlib.suppress(OSError):  # another session may be sweeping too
            if now - old.stat().st_mtime > TRACE_MAX_AGE_S:
                old.unlink()
    path = folder / f"talon-trace-{uuid.uuid4().hex[:12]}.json"
    dump_trace(str(path), summary, steps)
    return str(path)


def upload_path(value: Any) -> str:
    """The local path of an uploaded file (gr.File gives a path; API clients may send a dict)."""
    if isinstance(value, Mapping):
        return str(value.get("path") or value.get("name") or "")
    return str(getattr(value, "name", value))
