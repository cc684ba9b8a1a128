"""Shared pytest configuration and fixtures: the one home of every fixture more than one test
module uses (their helpers: tests/tiny.py, tests/steps.py, tests/browser.py)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def user_cost_cache() -> Path:
    """Where a user's measured cost curves live (what no test may read or write)."""
    return Path(os.environ.get("TALON_CACHE") or "~/.cache/talon").expanduser() / "costs"


def cost_cache_state() -> dict[str, float]:
    folder = user_cost_cache()
    return {p.name: p.stat().st_mtime for p in folder.iterdir()} if folder.is_dir() else {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "embedded: uses the real embedded model pair (converted once into the cache; slow on first use)",
    )
    # Cost curves measured under a test's load must never reach a user's app: every engine the
    # suite builds, in this process or in an app it starts, caches them in a temporary folder.
    # The converted models keep their shared cache (TALON_CACHE).
    share_the_cores()
    config.talon_user_costs = cost_cache_state()  # type: ignore[attr-defined]
    config.talon_cost_dir = tempfile.mkdtemp(prefix="talon-test-costs-")  # type: ignore[attr-defined]
    os.environ["TALON_COST_CACHE"] = config.talon_cost_dir  # type: ignore[attr-defined]


def share_the_cores() -> None:
    """An xdist worker computes on its share of the cores, and so do the apps and CLI children it
    starts (they inherit OMP_NUM_THREADS): torch's OpenMP threads spin while they wait, so two
    workers each running as many threads as there are cores slow each other several times over."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(threads)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    shutil.rmtree(getattr(config, "talon_cost_dir", ""), ignore_errors=True)
    if hasattr(config, "talon_user_costs") and cost_cache_state() != config.talon_user_costs:
        print(f"\nFAILED: the test suite changed the user's cost cache {user_cost_cache()}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# scripts/test.sh runs the suite on two xdist workers (``-n auto --dist loadscope``, scheduled here)
# where the machine has the cores and memory. Each module is one unit of work, so its module
# fixtures are set up once. The modules on the real embedded pair are one unit, run one after
# another on one worker: one worker converts and holds the pair. The longest units are handed out
# first. (xdist's own ``loadgroup`` does not group under pytest 9.2: it rewrites a node id field
# that pytest no longer reads.)
EMBEDDED_MODULES = ("test_embedded", "test_embedded_int4", "test_startup_status")
LONGEST_FIRST = ("embedded", *(f"tests/test_{name}.py" for name in (  # by their time on 2 cores (docs/runs)
    "gpu_check", "full_depth", "browser", "sampling", "llamacpp", "hardening", "chain", "static", "flood",
    "layers", "engine", "lessons", "atlas_browser", "app", "gpu_table", "gpu_space")))


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its module's path, or "embedded"."""
    module = nodeid.split("::")[0]
    return "embedded" if Path(module).stem in EMBEDDED_MODULES else module


# Two workers hold more at once: up to 9.5 GB of anonymous memory, 16 GB with the pages mapped
# beside it (the embedded target's 6 GB checkpoint; docs/runs/2026-11-28-suite-parallel.md). With
# less memory than this the suite runs in one process, as it did within an 8 GiB cap.
PARALLEL_MEMORY = 20 << 30


def memory_limit() -> int:
    """Bytes this process may use: the machine's memory, or less where a memory cgroup (v1 or v2,
    this one or any above it) caps it."""
    limits = [os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")]
    cgroups = Path("/proc/self/cgroup")
    for line in cgroups.read_text().splitlines() if cgroups.is_file() else []:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # cgroup v1
            root, name = "/sys/fs/cgroup/memory", "memory.limit_in_bytes"
        elif controllers == "":  # cgroup v2
            root, name = "/sys/fs/cgroup", "memory.max"
        else:
            continue
        folder = Path(root + path)
        while True:
            limit = folder / name
            if limit.is_file() and (text := limit.read_text().strip()).isdigit():
                limits.append(int(text))
            if str(folder) == root:
                break
            folder = folder.parent
    return min(limits)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (scripts/test.sh): two workers where two cores and ``PARALLEL_MEMORY`` allow,
    else none (the suite in one process)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 2 if cores >= 2 and memory_limit() >= PARALLEL_MEMORY else 0


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadscope":
        return None  # xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return UnitScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("embedded") and item.path.stem not in EMBEDDED_MODULES:
            raise pytest.UsageError(f"{item.nodeid} uses the embedded pair: name its module in "
                                    "tests/conftest.py's EMBEDDED_MODULES (one worker holds the pair)")
    rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(work_unit(item.nodeid), len(rank)))  # stable: file order otherwise


@pytest.fixture(scope="session")
def tiny_app_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python app.py`` on tiny models, started once for the API and browser tests (each visitor's
    data lives in its own ``gr.State``: nothing a test does is another's)."""
    from tests.tiny import launch_app

    with launch_app(tmp_path_factory.mktemp("app")) as url:
        yield url


@pytest.fixture(scope="module")
def app_url(tiny_app_url: str) -> str:
    """The shared tiny app's URL (a module may point ``client`` at its own app by overriding
    nothing: it asks for another fixture by another name)."""
    return tiny_app_url


@pytest.fixture()
def client(app_url: str, tmp_path: Path) -> Any:
    """A gradio_client ``Client`` of the shared tiny app, downloading into the test's folder."""
    from gradio_client import Client

    return Client(app_url, verbose=False, download_files=str(tmp_path))


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """Debian's chromium under Playwright, launched once for the session (each test opens its own
    context: no cookie, storage or page is shared); skipped or failed, as
    ``tests.browser.require_chromium`` says, where chromium is missing."""
    from playwright.sync_api import sync_playwright

    from tests.browser import CHROMIUM, CHROMIUM_ARGS, require_chromium

    require_chromium()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture()
def page(app_url: str, chromium: Any) -> Iterator[Any]:
    """A page of the shared tiny app, in a fresh browser context of the session's chromium."""
    from tests.browser import TIMEOUT_MS

    context = chromium.new_context(viewport={"width": 1440, "height": 1000})
    try:
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(app_url)
        page.wait_for_selector("#talon-run")
        yield page
    finally:
        context.close()


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny target and draft saved as local checkpoints (``tests.tiny.save_tiny_pair``)."""
    from tests.tiny import save_tiny_pair

    return save_tiny_pair(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny_engine() -> Any:
    """An ``Engine`` over the tiny pair (target seed 0, draft seed 1), shared by the session."""
    from talon.engine.engine import Engine
    from tests.tiny import tiny_loaded

    return Engine(tiny_loaded("llama", 0), tiny_loaded("llama", 1))


@pytest.fixture()
def view(tiny_engine: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The Decode tab's view, built in a throwaway Blocks, its runs served by ``tiny_engine``."""
    import gradio as gr

    import talon.server.pair
    from talon.ui.decode_tab import decode_panel

    monkeypatch.setattr(talon.server.pair, "load_engine", lambda settings, preset: tiny_engine)
    with gr.Blocks():
        decode_view, _, _ = decode_panel()
    return decode_view


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After every test (its fixtures gone), hand the heap's free pages back to the system, and
    after a module's last test collect its garbage first: glibc keeps what a freed model held
    (2.8 GB after ``test_full_depth.py``, measured) for this process alone, beside the other
    worker's, and a later large model's pages come on top of it. A trim takes 2 ms at most (a fragmented 2 GB heap)."""
    import gc

    from talon.models.memory import trim_host_heap

    if nextitem is None or nextitem.module is not item.module:
        gc.collect()
    trim_host_heap()


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    """``TALON_RSS_LOG=FILE``: after every test, its id and the MiB of ``tests.tiny.RSS_FIELDS`` (resident
    now, the peak so far, anonymous, file-backed): what finds the test that holds the most."""
    log = os.environ.get("TALON_RSS_LOG")
    if log and Path("/proc/self/status").exists():
        from tests.tiny import rss_kib

        with open(log, "a", encoding="utf-8") as fh:
            fh.write("\t".join(str(kib // 1024) for kib in rss_kib()) + f"\t{nodeid}\n")


@pytest.fixture(scope="session")
def tiny_head_pair() -> tuple:
    """``tests.tiny.trained_pair``: a tiny target and an EAGLE-3 head trained on its text."""
    from tests.tiny import trained_pair

    return trained_pair()


def _record(target: object, draft: object, drafter: str, path: Path) -> Path:
    """The atlas of the tiny target's first head prompt followed by its own greedy text, as a file."""
    import json

    from talon.atlas.record import record_atlas
    from talon.cost.model import synthetic_costs
    from talon.engine.engine import Engine
    from talon.run_config import RunConfig
    from tests.tiny import HEAD_PROMPTS, greedy_text

    costs = synthetic_costs({1: 0.1, 4: 0.11, 16: 0.14, 64: 0.3}, {1: 0.004, 16: 0.006, 64: 0.012})
    ids = greedy_text(target, HEAD_PROMPTS[0], 12)
    atlas = record_atlas(Engine(target, draft, costs=costs), ids,
                         RunConfig(drafter=drafter, max_new_tokens=40, chat_template=False))
    path.write_text(json.dumps(atlas.to_dict()), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def head_atlas_file(tiny_head_pair: tuple, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An atlas recorded with the tiny EAGLE-3 head in the draft slot."""
    target, head = tiny_head_pair
    return _record(target, head, "eagle3-hybrid", tmp_path_factory.mktemp("head-atlas") / "tiny-head.atlas.json")


@pytest.fixture(scope="session")
def model_atlas_file(tiny_head_pair: tuple, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same prompt's atlas recorded with a draft model in the slot: the tiny target with noise
    on its weights (so some of its drafts are accepted, not all)."""
    from talon.gpucheck.pairs import noisy

    target, _ = tiny_head_pair
    path = tmp_path_factory.mktemp("model-atlas") / "model.atlas.json"
    return _record(target, noisy(target, 0.15, 3), "hybrid", path)


@pytest.fixture(scope="session")
def mtp_atlas_file(tiny_head_pair: tuple, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same prompt's atlas recorded with an MTP layer drafting: a copy of the tiny target that
    declares one, trained briefly on the target's text (``tests.tiny.mtp_target``)."""
    from tests.tiny import mtp_target

    target, _ = tiny_head_pair
    return _record(mtp_target(target), None, "mtp-hybrid", tmp_path_factory.mktemp("mtp-atlas") / "mtp.atlas.json")
