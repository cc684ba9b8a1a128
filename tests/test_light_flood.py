"""Anonymous callers flooding what runs no model cannot take the host from a visitor's run: a real
server decodes while 16 callers post, each again as soon as it is answered,

* the largest atlas it accepts to ``/load_atlas`` through the plain HTTP route (the model-free
  limit and budget, ``talon.atlas.budget``), or
* the step slider's private event to the route the page uses (the door's pacing of the page's
  events, ``talon.ui.door``).

The run keeps at least 0.7x its speed alone, measured in the same test in pairs of runs alone and
flooded; every caller is answered or refused, none left hanging. The door reads which event a
request calls however it is named, and refuses a private event's queue entry."""

from __future__ import annotations

import gzip
import json
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from gradio_client import Client

from talon.trace import MAX_UPLOAD_BYTES
from tests.tiny import REPO, save_tiny_pair, serve

pytestmark = pytest.mark.browser  # a real server (no browser), run with the other server tests

CALLERS = 16
FLOODED_RUN = dict(compare_ar=False, cost_aware=False, max_new_tokens=420, api_name="/generate")  # a fixed plan
MIN_RATIO = 0.7
PAIRS = 5  # (alone, flooded) pairs of runs
QUIET_S = 60.0  # the most a run alone waits for the flood's last calls


def largest_atlas(path: Path) -> Path:
    """A bundled lesson atlas grown to just under the upload limit with valid children the
    replays never reach (deeper paths under its own nodes): the largest file ``/load_atlas``
    accepts, parsed in full on every call."""
    data = json.loads(gzip.decompress((REPO / "data" / "lessons" / "sum-1.json.gz").read_bytes()))
    rows = data["children"]
    base = [row for row in rows if len(row[1]) < 8][:2000]
    size, extra = len(json.dumps(data)), []
    while size < MAX_UPLOAD_BYTES - 200_000:
        p, node, tokens, q = base[len(extra) % len(base)]
        extra.append([p, [*node, 100_000 + len(extra) // len(base)], tokens, q])
        size += len(json.dumps(extra[-1])) + 2
    data["children"] = rows + extra
    path.write_text(json.dumps(data), encoding="utf-8")
    assert MAX_UPLOAD_BYTES - 400_000 < path.stat().st_size <= MAX_UPLOAD_BYTES
    return path


@dataclass
class Caller:
    """One anonymous caller: ``setup`` once (it returns the route and the body to post), then that
    post again and again while the flood is on; an answer is counted when ``ok`` says it is one."""

    base: str
    setup: Callable[[httpx.Client], tuple[str, dict]]
    ok: Callable[[httpx.Response], bool]
    answered: int = 0
    refused: int = 0
    failures: list[str] = field(default_factory=list)
    slowest_s: float = 0.0
    busy: bool = False  # a call in flight
    uploaded: bool = False  # set up

    def run(self, stop: threading.Event, flooding: threading.Event) -> None:
        with httpx.Client(timeout=120) as http:
            route, body = self.setup(http)
            self.uploaded = True
            while not stop.is_set():
                if not flooding.wait(0.1):
                    continue
                self.busy, start = True, time.monotonic()
                try:
                    answer = http.post(self.base + route, json=body)
                except httpx.HTTPError as error:  # a hang past the timeout, or a dropped connection
                    self.failures.append(repr(error))
                    self.busy = False
                    continue
                self.slowest_s = max(self.slowest_s, time.monotonic() - start)
                if answer.status_code == 200 and self.ok(answer):
                    self.answered += 1
                elif answer.status_code in (429, 500) and ("busy" in answer.text or "budget" in answer.text):
                    self.refused += 1
                else:
                    self.failures.append(f"{answer.status_code}: {answer.text[:200]}")
                self.busy = False


def atlas_caller(base: str, atlas: Path, params: list[dict]) -> Caller:
    """Uploads ``atlas`` once, then posts it to ``/load_atlas`` by its plain HTTP route."""

    def setup(http: httpx.Client) -> tuple[str, dict]:
        with atlas.open("rb") as fh:
            path = http.post(base + "/upload", files={"files": fh}).json()[0]
        return "/run/load_atlas", {"data": [
            {"path": path, "meta": {"_type": "gradio.FileData"}} if p["parameter_name"] == "upload"
            else p["parameter_default"] for p in params]}

    return Caller(base, setup, lambda answer: "Atlas of" in json.dumps(answer.json()["data"][0]))


def step_caller(base: str, events: dict[str, int], session: str) -> Caller:
    """Asks for step 5 of the recording ``session`` has open, by the slider's private event
    (``show_step``) posted to the route the page uses (``/run/predict`` with its ``fn_index``)."""
    body = {"fn_index": events["show_step"], "data": [5, None], "session_hash": session}
    return Caller(base, lambda http: ("/run/predict", body), lambda answer: "(6 of " in answer.text)


def page_events(url: str) -> dict[str, int]:
    """Every event's ``fn_index`` by its API name, as any caller reads them from ``/config``."""
    config = httpx.get(url.rstrip("/") + "/config", timeout=30).json()
    return {dep["api_name"]: dep["id"] for dep in config["dependencies"] if dep.get("api_name")}


def open_recording(url: str, events: dict[str, int], session: str) -> None:
    """The shipped recording opened in ``session``, as the page opens it."""
    answer = httpx.post(url.rstrip("/") + "/gradio_api/run/predict", timeout=60,
                        json={"fn_index": events["open_recording"], "data": [None], "session_hash": session})
    assert answer.status_code == 200 and "talon-caption" in answer.text, answer.text[:300]


def tokens_per_s(client: Client, tokens: int = FLOODED_RUN["max_new_tokens"]) -> float:
    start = time.monotonic()
    client.predict("The quick brown fox jumps over the lazy dog, again and again", **FLOODED_RUN)
    return tokens / (time.monotonic() - start)


@pytest.fixture(scope="module")
def tiny_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("light-flood")
    target, draft = save_tiny_pair(root)
    with serve(root, {"TALON_TARGET": str(target), "TALON_DRAFT": str(draft)}) as url:
        yield url, largest_atlas(root / "largest.atlas.json")


def flood_ratio(url: str, callers: list[Caller]) -> tuple[float, list[float], list[float]]:
    """The run's tok/s with ``callers`` flooding over its tok/s alone, in ``PAIRS`` pairs taken one
    after the other (a run alone, every caller's call answered; then a run 2 s into the flood), so
    that a load beside the test that changes over its minute weighs on both sides of each pair:
    the median of the pairs' ratios, and the runs' tok/s."""
    client = Client(url, verbose=False, download_files=False)  # the run, not its trace file
    tokens_per_s(client)  # warm: the pair loaded, the first run's one-time costs paid
    stop, flooding = threading.Event(), threading.Event()
    threads = [threading.Thread(target=c.run, args=(stop, flooding), daemon=True) for c in callers]
    for t in threads:
        t.start()
    deadline = time.monotonic() + QUIET_S
    while not all(c.uploaded for c in callers) and time.monotonic() < deadline:
        time.sleep(0.1)  # every caller is set up
    alone, flooded = [], []
    for _ in range(PAIRS):
        deadline = time.monotonic() + QUIET_S
        while any(c.busy for c in callers) and time.monotonic() < deadline:
            time.sleep(0.1)  # the flood's last calls answered: the run is alone
        alone.append(tokens_per_s(client))
        flooding.set()
        time.sleep(2)  # every caller is posting
        flooded.append(tokens_per_s(client))
        flooding.clear()
    stop.set()
    for t in threads:
        t.join(timeout=150)
    assert not any(t.is_alive() for t in threads), "a caller was left hanging"
    return statistics.median(f / a for f, a in zip(flooded, alone)), alone, flooded


def check_flood(url: str, callers: list[Caller]) -> None:
    """The run keeps ``MIN_RATIO`` of its speed; every caller is answered or refused, none fails."""
    ratio, alone, flooded = flood_ratio(url, callers)
    summary = (f"ratio {ratio:.2f} (alone {alone}, flooded {flooded} tok/s); answered "
               f"{sum(c.answered for c in callers)}, refused {sum(c.refused for c in callers)}, slowest answer "
               f"{max(c.slowest_s for c in callers):.1f} s")
    print(summary)
    assert not [f for c in callers for f in c.failures], [f for c in callers for f in c.failures][:3]
    assert all(c.answered + c.refused for c in callers), "every caller is answered or refused"
    assert sum(c.answered for c in callers) >= 1, summary  # the endpoint still works under the flood
    assert ratio >= MIN_RATIO, summary


def test_a_run_keeps_its_speed_while_callers_flood_the_model_free_endpoints(tiny_app) -> None:  # noqa: ANN001
    url, atlas = tiny_app
    base = url.rstrip("/") + "/gradio_api"
    params = Client(url, verbose=False).view_api(print_info=False, return_format="dict")["named_endpoints"][
        "/load_atlas"]["parameters"]
    check_flood(url, [atlas_caller(base, atlas, params) for _ in range(CALLERS)])


def test_a_run_keeps_its_speed_while_callers_flood_a_step_view(tiny_app) -> None:  # noqa: ANN001
    """The page's private events are as open as the API: one caller opens the recording in a
    session of its own, then 16 ask for a step again and again by the slider's event."""
    url, _ = tiny_app
    events = page_events(url)
    open_recording(url, events, "flood-views")
    check_flood(url, [step_caller(url.rstrip("/") + "/gradio_api", events, "flood-views") for _ in range(CALLERS)])


def test_the_door_reads_the_event_a_request_calls(tiny_app) -> None:  # noqa: ANN001
    """A private event's queue entry is refused, by index or by name; an index written as Gradio's
    model still reads it ("9") calls the event; a body past the door's size is refused."""
    url, _ = tiny_app
    base, events = url.rstrip("/") + "/gradio_api", page_events(url)
    open_recording(url, events, "door")
    step = {"data": [5, None], "session_hash": "door"}
    with httpx.Client(timeout=60) as http:
        joined = http.post(base + "/queue/join", json={**step, "fn_index": events["show_step"]})
        assert joined.status_code == 403 and "does not take the queue" in joined.text, joined.text
        called = http.post(base + "/call/show_step", json={"data": [5, None]})
        assert called.status_code == 403, called.text
        assert http.post(base + "/queue/join", json={**step, "fn_index": str(events["show_step"])}).status_code == 403
        shown = http.post(base + "/run/anything", json={**step, "fn_index": str(events["show_step"])})
        assert shown.status_code == 200 and "(6 of " in shown.text, shown.text[:300]
        big = http.post(base + "/run/predict", json={**step, "fn_index": events["show_step"], "pad": "x" * (2 << 20)})
        assert big.status_code == 413 and "/gradio_api/upload" in big.text, big.text
