"""Talon web app: build the UI from ``talon.ui`` and serve it.

Run ``python app.py``. The models come from the TALON_* variables (see ``talon.settings``); the
server honours GRADIO_SERVER_NAME and GRADIO_SERVER_PORT.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from talon import ui
from talon.settings import Settings

STATIC = Path(__file__).resolve().parent / "static"


def head_html() -> str:
    """The app's script, inlined into <head>."""
    return f"<script>\n{(STATIC / 'talon.js').read_text(encoding='utf-8')}\n</script>"


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    demo = ui.build_ui(settings)
    threading.Thread(target=ui.warm_up, args=(settings,), name="talon-warm-up", daemon=True).start()
    concurrency, max_size = ui.queue_limits(settings)
    demo.queue(default_concurrency_limit=concurrency, max_size=max_size)
    demo.launch(css=(STATIC / "talon.css").read_text(encoding="utf-8"), head=head_html(), theme=ui.theme())


if __name__ == "__main__":
    main()
