"""While the start-up pair loads, every page says which models load and how large they are, a
run pressed then waits with those words, and Stop ends the wait. The real embedded pair, in a
real ``python app.py``, driven in Chromium. Its load (the target packed to int4 from its GGUF
blocks, the draft quantized to int8) took 12-23 s, which a busy host's page could outlast: the
app gets its own cache, the suite's converted models linked in but not the joined GGUF, and the
test holds the lock under which the app joins it until Stop has been seen. It adds little memory
to the suite's (both models are read from the shared converted checkpoints)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from filelock import FileLock

from talon.gpucheck.launch import serve_app
from talon.models.embedded import EMBEDDED_MODELS, embedded_pair_paths
from talon.settings import EMBEDDED_TARGET
from tests.browser import SCREENSHOTS

pytestmark = [pytest.mark.browser, pytest.mark.embedded]

STATUS = "(document.querySelector('#talon-models-status')?.textContent || '')"
CAPTION_JS = "(document.querySelector('#talon-caption')?.textContent || '')"
APP_ENV = {"TALON_DEVICE": "cpu", "TALON_DTYPE": "float32", "TALON_DRAFT_QUANT": "int8", "TALON_PREPACK": "0",
           "TALON_TARGET_WEIGHTS": "int4"}


def test_the_page_names_the_models_while_they_load_and_stop_ends_the_wait(tmp_path: Path, chromium) -> None:  # noqa: ANN001
    cache = tmp_path / "cache"
    cache.mkdir()
    for converted in embedded_pair_paths():  # the suite's conversions, shared; the GGUF joined on demand
        (cache / Path(converted).name).symlink_to(converted, target_is_directory=True)
    joining = FileLock(str(cache / f"{EMBEDDED_MODELS[EMBEDDED_TARGET].dir_name}.lock"))  # as the app takes it
    context = chromium.new_context(viewport={"width": 1440, "height": 1000})  # ready before the app
    joining.acquire()
    try:
        page = context.new_page()
        page.set_default_timeout(60_000)
        with serve_app({**os.environ, **APP_ENV, "TALON_CACHE": str(cache)}, tmp_path / "app.log", 300) as url:
            page.goto(url)
            page.wait_for_function(f"{STATUS}.includes('Loading the models: qwen2.5-coder-1.5b-instruct + "
                                   "qwen2.5-coder-0.5b-instruct (1.6 GB of GGUF weights)')")
            page.click("#talon-run")
            page.wait_for_function(f"{CAPTION_JS}.includes('Waiting for the models') && "
                                   f"{CAPTION_JS}.includes('s so far')")
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "loading.png"))
            page.click("#talon-stop")
            page.wait_for_function(f"{CAPTION_JS}.includes('Stopped while the models loaded')")
            joining.release()  # the app joins the GGUF and packs the target
            page.wait_for_function(f"{STATUS}.includes('Models ready: qwen2.5-coder-1.5b-instruct')",
                                   timeout=240_000)
    finally:
        if joining.is_locked:
            joining.release()
        context.close()
