"""A full queue: more runs than the queue holds, kept full by a client that tops it up, while a
new visitor opens the page in Chromium, steps through the recording, starts the walk and presses
Stop. Gradio counts every waiting event against the queue's size, so these answer only because
every event that runs no model skips the queue (``talon.ui.layout.outside_queue``); and an API
caller is answered the same way, through the plain HTTP route of those endpoints."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gradio_client import Client

from tests.browser import TIMEOUT_MS, require_chromium, tree_step, wait_for_recording
from tests.tiny import save_tiny_pair, serve

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
            try:
                if sum(not job.done() for job in self.jobs) < QUEUE_SIZE + 2:
                    self.jobs.append(self.client.submit("hello hello hello world, hello", **RUN))
            except Exception:  # noqa: BLE001 - a failed submit must not end the flood
                pass
            time.sleep(0.02)

    def refused(self) -> int:
        return sum(1 for job in self.jobs if job.done() and "Queue is full" in str(_error(job)))

    def full_now(self, tries: int = 10, timeout: float = 3.0) -> bool:
        """A run submitted now is turned away (the queue is full at this moment). A run that ends
        frees its place for the instant the flood takes to refill it, so a probe that lands in
        that instant is admitted (on two busy cores that instant can recur several times): one
        refusal in ``tries`` probes shows the queue is kept full. A refusal answers at once, so a
        probe still waiting after ``timeout`` seconds was admitted."""
        for _ in range(tries):
            job = self.client.submit("one more", **RUN)
            deadline = time.monotonic() + timeout
            while not job.done() and time.monotonic() < deadline:
                time.sleep(0.05)
            refused = job.done() and "Queue is full" in str(_error(job))
            if not job.done():
                job.cancel()
            if refused:
                return True
        return False


def _error(job) -> BaseException | None:  # noqa: ANN001 - a gradio_client Job
    try:
        job.result(timeout=0)
    except Exception as error:  # noqa: BLE001 - the refusal is what we look for
        return error
    return None


@pytest.fixture(scope="module")
def flooded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Flood]]:
    """One app, flooded for the module: each test checks the queue is full before it starts."""
    require_chromium()
    tmp_path = tmp_path_factory.mktemp("flooded")
    target, draft = save_tiny_pair(tmp_path)
    env = {"TALON_TARGET": str(target), "TALON_DRAFT": str(draft), "TALON_QUEUE_SIZE": str(QUEUE_SIZE),
           "TALON_QUEUE_CONCURRENCY": "1"}
    with serve(tmp_path, env) as url:
        flood = Flood(url)
        flood.thread.start()
        try:
            deadline = time.monotonic() + 60
            while not (flood.refused() and flood.full_now(tries=1)) and time.monotonic() < deadline:
                time.sleep(0.1)
            yield url, flood
        finally:
            flood.done.set()
            flood.thread.join(timeout=5)


def test_a_full_queue_still_answers_page_loads_the_slider_the_walk_and_stop(flooded, chromium) -> None:  # noqa: ANN001
    url, flood = flooded
    assert flood.refused() > 0 and flood.full_now(), "the queue is full: runs are turned away"
    errors: list[str] = []
    context = chromium.new_context(viewport={"width": 1440, "height": 1000})
    try:
        page = context.new_page()
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
        context.close()
    assert errors == [], errors


def test_only_the_model_runs_wait_in_the_queue() -> None:
    from talon.settings import Settings
    from talon.ui.layout import build_ui
    from talon.ui.panel import MODEL_CONCURRENCY_ID

    fns = list(build_ui(Settings()).fns.values())
    queued = {fn.name for fn in fns if fn.queue}
    assert queued == {"generate", "compare", "record", "sweep"}
    assert all(fn.concurrency_id == MODEL_CONCURRENCY_ID for fn in fns if fn.queue)
    assert {"opened", "open_recording", "show_step", "stop", "walk_to"} <= {fn.name for fn in fns if not fn.queue}


def light_endpoints(url: str) -> set[str]:
    """The public endpoints that run no model (out of the queue), from the server's own config."""
    deps = httpx.get(url.rstrip("/") + "/config").json()["dependencies"]
    return {d["api_name"] for d in deps if d.get("api_visibility") == "public" and not d["queue"]}


def run_directly(url: str, client: Client, name: str, files: dict[str, Path], **values: object) -> list:
    """``POST /gradio_api/run/NAME``, the documented route that skips the queue: the endpoint's
    parameters in order (defaults unless ``values`` or ``files`` name them; files uploaded first)."""
    base = url.rstrip("/") + "/gradio_api"
    params = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/" + name]["parameters"]
    data = []
    for p in params:
        if p["parameter_name"] in files:
            with files[p["parameter_name"]].open("rb") as fh:
                path = httpx.post(base + "/upload", files={"files": fh}, timeout=30).json()[0]
            data.append({"path": path, "meta": {"_type": "gradio.FileData"}})
        else:
            data.append(values.get(p["parameter_name"], p["parameter_default"]))
    # a light call keeps 5 % of the time while runs go (talon.atlas.budget): a head atlas's replays
    # take tens of seconds then, on a busy two-core host
    answer = httpx.post(f"{base}/run/{name}", json={"data": data}, timeout=90)
    assert answer.status_code == 200, (name, answer.status_code, answer.text[:300])
    return answer.json()["data"]


def test_an_api_caller_is_answered_outside_the_queue_while_runs_wait(flooded, head_atlas_file: Path,
                                                                     tmp_path: Path) -> None:
    """With the queue full of runs, every public endpoint that runs no model answers a plain HTTP
    call at once and correctly (the fix: ``outside_queue``; queued, the route refuses them)."""
    url, flood = flooded
    assert flood.refused() > 0 and flood.full_now(), "the queue is full: runs are turned away"
    client = Client(url, verbose=False)
    assert light_endpoints(url) == {"replay", "load_atlas", "load_sweep", "serving_config"}
    sweep = tmp_path / "results.json"
    sweep.write_text(json.dumps({"results": [{"suite": "qa", "method": "talon", "mu": 0.1, "budget": 8, "mat": 2.0,
                                              "tokens_per_second": 9.0}]}))
    recording = Path(__file__).resolve().parents[1] / "static" / "recording.json"
    start = time.monotonic()
    flags = run_directly(url, client, "serving_config", {}, budget=32)
    sglang = flags[1]["sglang_flags"]
    assert int(sglang[sglang.index("--speculative-num-draft-tokens") + 1]) > 17, sglang  # budget 32, not 16
    replayed = run_directly(url, client, "replay", {"trace_file": recording})
    assert "replayed trace" in replayed[0]
    atlas = run_directly(url, client, "load_atlas", {"upload": head_atlas_file}, drafter="hybrid")
    assert "EAGLE-3 head" in atlas[0] and "best found" in atlas[1] and atlas[-1]["value"] == "eagle3-hybrid"
    swept = run_directly(url, client, "load_sweep", {"results_file": sweep})
    assert swept and "qa" in json.dumps(swept)
    assert time.monotonic() - start < 180 and flood.full_now(), "answered while the queue stayed full"
    # a model run cannot take the same route past the queue: it is told to join it
    refused = httpx.post(url.rstrip("/") + "/gradio_api/run/generate", json={"data": ["hello"]}, timeout=30)
    assert refused.status_code == 404 and "join the queue" in refused.text, refused.text[:300]
