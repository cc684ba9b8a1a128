"""A full queue: more runs than the queue holds, kept full by a client that tops it up, while a
new visitor opens the page in Chromium, steps through the recording, starts the walk and presses
Stop. Gradio counts every waiting event against the queue's size, so these answer only because
every event that runs no model skips the queue (``talon.ui.layout.outside_queue``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gradio_client import Client

from tests.test_app import save_tiny_pair, serve
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, require_chromium, tree_step, wait_for_recording

pytestmark = pytest.mark.browser

QUEUE_SIZE = 2
RUN = dict(compare_ar=True, max_new_tokens=400, api_name="/generate")  # about 1.5 s a run on tiny models


class Flood:
    """Keeps more runs in flight than the queue holds; counts the ones it turned away."""

    def __init__(self, url: str) -> None:
        self.client = Client(url, verbose=False)
        self.jobs: list = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.is_set():
            if sum(not job.done() for job in self.jobs) < QUEUE_SIZE + 2:
                self.jobs.append(self.client.submit("hello hello hello world, hello", **RUN))
            time.sleep(0.05)

    def refused(self) -> int:
        return sum(1 for job in self.jobs if job.done() and "Queue is full" in str(_error(job)))

    def full_now(self, timeout: float = 10.0) -> bool:
        """A run submitted now is turned away (the queue is full at this moment)."""
        job = self.client.submit("one more", **RUN)
        deadline = time.monotonic() + timeout
        while not job.done() and time.monotonic() < deadline:
            time.sleep(0.05)
        refused = job.done() and "Queue is full" in str(_error(job))
        if not job.done():
            job.cancel()
        return refused


def _error(job) -> BaseException | None:  # noqa: ANN001 - a gradio_client Job
    try:
        job.result(timeout=0)
    except Exception as error:  # noqa: BLE001 - the refusal is what we look for
        return error
    return None


@pytest.fixture()
def flooded(tmp_path: Path) -> Iterator[tuple[str, Flood]]:
    require_chromium()
    target, draft = save_tiny_pair(tmp_path)
    env = {"TALON_TARGET": str(target), "TALON_DRAFT": str(draft), "TALON_QUEUE_SIZE": str(QUEUE_SIZE),
           "TALON_QUEUE_CONCURRENCY": "1"}
    with serve(tmp_path, env) as url:
        flood = Flood(url)
        flood.thread.start()
        try:
            deadline = time.monotonic() + 60
            while flood.refused() == 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            yield url, flood
        finally:
            flood.done.set()
            flood.thread.join(timeout=5)


def test_a_full_queue_still_answers_page_loads_the_slider_the_walk_and_stop(flooded) -> None:
    from playwright.sync_api import sync_playwright

    url, flood = flooded
    assert flood.refused() > 0 and flood.full_now(), "the queue is full: runs are turned away"
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            page.on("console", lambda msg: errors.append(msg.text) if "Queue is full" in msg.text else None)
            page.goto(url)
            wait_for_recording(page)  # the page load's event: the opening recording
            before = tree_step(page)
            page.locator("#talon-next").click()  # the stepper (the slider's neighbour, the same handler)
            page.wait_for_function(f"!/step {before}\\b/.test(document.querySelector('#talon-tree .gtitle')"
                                   ".textContent)")
            page.locator("#talon-slider input[type=range]").fill("0")  # the slider itself
            page.wait_for_function("/step 0\\b/.test(document.querySelector('#talon-tree .gtitle').textContent)")
            page.click("#talon-walk-start")
            page.wait_for_selector("#talon-walk .talon-walk-head")
            page.click("#talon-stop")
            page.wait_for_timeout(500)
            assert flood.full_now(), "the queue stayed full while the page answered"
            toasts = page.locator(".toast-body").all_text_contents()
            assert not any("Queue is full" in t for t in toasts), toasts
        finally:
            browser.close()
    assert errors == [], errors


def test_only_the_model_runs_wait_in_the_queue() -> None:
    from talon.settings import Settings
    from talon.ui.layout import build_ui
    from talon.ui.panel import MODEL_CONCURRENCY_ID

    fns = list(build_ui(Settings()).fns.values())
    queued = {fn.name for fn in fns if fn.queue}
    assert queued == {"generate", "compare", "record", "sweep"}
    assert all(fn.concurrency_id == MODEL_CONCURRENCY_ID for fn in fns if fn.queue)
    assert {"show_recording", "set_controls", "show_step", "stop", "walk_to"} <= {fn.name for fn in fns
                                                                                  if not fn.queue}
