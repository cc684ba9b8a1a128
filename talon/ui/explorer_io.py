"""The Threshold explorer's files and device work: record a prompt's atlas on the device (the models
run once: a greedy run and batched draft forwards, ``talon.atlas.record``; on ZeroGPU in a GPU
worker), write it for download, read an uploaded one."""

from __future__ import annotations

import contextlib
import json
import math
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import gradio as gr

from talon.atlas.data import Atlas, parse_atlas
from talon.atlas.record import record_atlas
from talon.presets import ModelPreset
from talon.run_config import RunConfig
from talon.settings import Settings
from talon.trace import TraceFileError, read_json_upload
from talon.ui.device import GPU_MAX_S, GPU_PER_TOKEN_S, gpu_seconds, on_gpu
from talon.ui.models import load_engine, out_of_memory_as_error
from talon.ui.request import Job
from talon.ui.controls import user_error
from talon.ui.files import TRACE_MAX_AGE_S, trace_dir, upload_path


def record_seconds(settings: Settings, preset: ModelPreset, prompt: str, cfg: RunConfig) -> int:
    """GPU seconds to reserve for a recording: a run (and a load, where another pair is held) plus
    the draft's batched forwards."""
    run = gpu_seconds(settings, [Job(preset, prompt, cfg)])
    return min(GPU_MAX_S, math.ceil(run + GPU_PER_TOKEN_S * cfg.max_new_tokens))


@on_gpu(duration=record_seconds)
def record_on_device(
    settings: Settings, preset: ModelPreset, prompt: str, cfg: RunConfig
) -> Iterator[tuple[float, str] | Atlas]:
    """Record the atlas of ``prompt``: yields (fraction done, what is happening), then the Atlas.
    Takes and yields only picklable values (on ZeroGPU it runs in a GPU worker)."""
    events: queue.Queue[tuple[float, str] | Atlas | BaseException] = queue.Queue()

    def work() -> None:
        try:
            with out_of_memory_as_error(cfg):
                engine = load_engine(settings, preset)
                events.put(record_atlas(engine, prompt, cfg, progress=lambda f, what: events.put((f, what))))
        except BaseException as error:  # handed to the caller's thread, raised there
            events.put(error)

    threading.Thread(target=work, daemon=True, name="talon-atlas-record").start()
    while True:
        item = events.get()
        if isinstance(item, BaseException):
            raise item
        yield item
        if isinstance(item, Atlas):
            return


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
