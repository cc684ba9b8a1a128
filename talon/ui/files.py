"""Files the app hands out and takes in: trace downloads written to a temporary folder that is
swept of old files, and the local path of an uploaded file (reading and checking what is in
it is ``talon.trace``'s job), and a prompt's draft atlas written for download or read from an upload."""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gradio as gr

from talon.atlas.data import Atlas, parse_atlas
from talon.server.facade import user_error
from talon.trace import RunSummary, StepTrace, TraceFileError, dump_trace, read_json_upload

TRACE_DIR_NAME = "talon-traces"
TRACE_MAX_AGE_S = 3600


def trace_dir() -> Path:
    path = Path(tempfile.gettempdir()) / TRACE_DIR_NAME
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fresh(prefix: str, suffix: str) -> Path:
    """A new download path in the swept folder (files older than an hour are removed first)."""
    folder = trace_dir()
    now = time.time()
    for old in folder.glob(f"{prefix}-*{suffix}"):
        with contextlib.suppress(OSError):  # another session may be sweeping too
            if now - old.stat().st_mtime > TRACE_MAX_AGE_S:
                old.unlink()
    return folder / f"{prefix}-{uuid.uuid4().hex[:12]}{suffix}"


def write_trace(summary: RunSummary, steps: list[StepTrace]) -> str:
    """Write the run as a talon-trace/1 JSON file for download; old files are swept away."""
    path = _fresh("talon-trace", ".json")
    dump_trace(str(path), summary, steps)
    return str(path)


def write_lesson(page: str) -> str:
    """Write an exported lesson (one HTML file) for download; old ones are swept away."""
    path = _fresh("talon-lesson", ".html")
    path.write_text(page, encoding="utf-8")
    return str(path)


def upload_path(value: Any) -> str:
    """The local path of an uploaded file (gr.File gives a path; API clients may send a dict)."""
    if isinstance(value, Mapping):
        return str(value.get("path") or value.get("name") or "")
    return str(getattr(value, "name", value))


def write_atlas(atlas: Atlas) -> str:
    """Write the atlas as a talon-atlas/1 JSON file for download; old files are swept away."""
    folder, now = trace_dir(), time.time()
    for old in folder.glob("talon-atlas-*.json"):
        with contextlib.suppress(OSError):  # another session may be sweeping too
            if now - old.stat().st_mtime > TRACE_MAX_AGE_S:
                old.unlink()
    path = folder / f"talon-atlas-{uuid.uuid4().hex[:12]}.json"
    path.write_text(json.dumps(atlas.to_dict(), separators=(",", ":")), encoding="utf-8")
    return str(path)


def read_atlas(upload: Any) -> Atlas:
    """The atlas in an uploaded file; a gr.Error that says what is wrong otherwise."""
    if not upload:
        raise gr.Error("no file: upload an atlas JSON downloaded from this tab or written by `talon atlas record`")
    try:
        return parse_atlas(read_json_upload(upload_path(upload)))
    except (TraceFileError, OSError) as error:
        raise user_error(f"cannot load this atlas: {error}") from error
