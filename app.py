"""Talon web app: build the UI from ``talon.ui`` and serve it.

Run ``python app.py``. The models come from the TALON_* variables (see ``talon.settings``); the
server honours GRADIO_SERVER_NAME and GRADIO_SERVER_PORT.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from talon.models import zerogpu

ZEROGPU = zerogpu.active()  # first: on ZeroGPU, importing `spaces` patches torch before anything uses CUDA

import gradio as gr  # noqa: E402

from talon import ui  # noqa: E402
from talon.models import gpu_health  # noqa: E402
from talon.run_config import ConfigError  # noqa: E402
from talon.settings import Settings  # noqa: E402

logger = logging.getLogger("talon.app")

STATIC = Path(__file__).resolve().parent / "static"


def head_html() -> str:
    """The app's script, inlined into <head>."""
    return f"<script>\n{(STATIC / 'talon.js').read_text(encoding='utf-8')}\n</script>"


def build_app(settings: Settings) -> gr.Blocks:
    """The UI with its queue: model runs share one concurrency group, and the queue holds at most
    TALON_QUEUE_SIZE requests (``ui.queue_limits``). ``api_open=False``: the plain HTTP route
    (``/gradio_api/run/NAME``) runs only what needs no queue, so no API call skips the model runs'
    queue (what runs no model answers there at once)."""
    demo = ui.build_ui(settings)
    concurrency, max_size = ui.queue_limits(settings)
    return demo.queue(default_concurrency_limit=concurrency, max_size=max_size, api_open=False)


def start_models(settings: Settings) -> None:
    """Load the start-up pair. On ZeroGPU: on this (the main) thread, before ``launch()``, on a
    stack ZeroGPU supports (else ``ZeroGPUUnsupported``); elsewhere in a background thread, so
    the page is up at once."""
    if not ZEROGPU:
        threading.Thread(target=ui.warm_up, args=(settings,), name="talon-warm-up", daemon=True).start()
        return
    for problem in zerogpu.check_supported(settings.zerogpu_unsupported_ok):  # raises unless allowed
        logger.warning("ZeroGPU does not support %s; starting anyway (TALON_ZEROGPU_UNSUPPORTED_OK=1)", problem)
    ui.warm_up(settings)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = Settings.from_env()
        ui.initial_preset(settings)  # TALON_PRESET / TALON_PRESETS name what this server can hold, or say why not
    except ConfigError as error:
        raise SystemExit(f"talon: {error}") from None
    if (unusable := gpu_health.unusable_gpu()) is not None:
        logger.warning("%s", unusable)
    try:
        start_models(settings)
    except zerogpu.ZeroGPUUnsupported as error:
        logger.error("%s", error)
        raise SystemExit(f"talon: {error}") from None
    demo = build_app(settings)
    # No allowed_paths: the CSS and script are inlined, so the server hands out only the files the
    # app itself returns (trace downloads); uploads beyond the validators' limit are refused early.
    demo.launch(
        css=(STATIC / "talon.css").read_text(encoding="utf-8"),
        head=head_html(),
        theme=ui.theme(),
        max_file_size=ui.MAX_UPLOAD_BYTES,
        app_kwargs={"middleware": ui.door_for(demo)},  # every request held to its bound (talon/ui/door.py)
    )


if __name__ == "__main__":
    main()
