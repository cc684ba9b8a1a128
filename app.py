"""Talon web app: build the UI from ``talon.ui`` and serve it.

Run ``python app.py``. The models come from the TALON_* variables (see ``talon.settings``); the
server honours GRADIO_SERVER_NAME and GRADIO_SERVER_PORT.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import gradio as gr

from talon import ui
from talon.settings import Settings

STATIC = Path(__file__).resolve().parent / "static"


def head_html() -> str:
    """The app's script, inlined into <head>."""
    return f"<script>\n{(STATIC / 'talon.js').read_text(encoding='utf-8')}\n</script>"


def build_app(settings: Settings) -> gr.Blocks:
    """The UI with its queue: model runs share one concurrency group, and the queue holds at most
    TALON_QUEUE_SIZE requests (``ui.queue_limits``)."""
    demo = ui.build_ui(settings)
    concurrency, max_size = ui.queue_limits(settings)
    return demo.queue(default_concurrency_limit=concurrency, max_size=max_size)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    demo = build_app(settings)
    threading.Thread(target=ui.warm_up, args=(settings,), name="talon-warm-up", daemon=True).start()
    # No allowed_paths: the CSS and script are inlined, so the server hands out only the files the
    # app itself returns (trace downloads); uploads beyond the validators' limit are refused early.
    demo.launch(
        css=(STATIC / "talon.css").read_text(encoding="utf-8"),
        head=head_html(),
        theme=ui.theme(),
        max_file_size=ui.MAX_UPLOAD_BYTES,
    )


if __name__ == "__main__":
    main()
