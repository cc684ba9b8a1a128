"""The app in a real browser: Playwright drives Debian's chromium against ``python app.py`` on
tiny models. Run the default example, see streamed text and a tree plot with nodes, move the
step slider and see the plot change; a screenshot goes to out/screenshots/."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_app import REPO, launch_app

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = REPO / "out" / "screenshots"
TIMEOUT_MS = 60_000
TREE_POINTS = "#talon-tree .scatterlayer .trace .point"
TREE_TITLE = "#talon-tree .gtitle"


def require_chromium() -> None:
    """Missing chromium fails the test in CI (CI=true) and skips it elsewhere."""
    if CHROMIUM.exists():
        return
    message = f"{CHROMIUM} not found: apt-get install -y chromium"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def app_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_chromium()
    with launch_app(tmp_path_factory.mktemp("browser-app")) as url:
        yield url


@pytest.fixture()
def page(app_url: str) -> Iterator:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(app_url)
            page.wait_for_selector("#talon-run")
            yield page
        finally:
            browser.close()


def tree_step(page) -> int:
    """The step number in the tree figure's title ("Draft tree, step N: ...")."""
    match = re.search(r"step (\d+)", page.locator(TREE_TITLE).text_content() or "")
    assert match, "the tree plot has no step title"
    return int(match.group(1))


def test_run_streams_text_and_tree_and_the_slider_replots(page) -> None:
    page.click("#talon-run")
    page.wait_for_selector("#talon-text .tk")  # streamed text with provenance spans
    page.wait_for_function(f"document.querySelectorAll('{TREE_POINTS}').length > 2")
    page.wait_for_selector("#talon-summary .detail")  # the run's summary: it has finished
    assert page.locator("#talon-text .tk").count() >= 16
    assert page.locator("#talon-text .tk.src-bonus").count() >= 1
    last = tree_step(page)
    assert last >= 1, "the default example should take several steps"

    slider = page.locator("#talon-slider input[type=range]")
    slider.focus()
    page.keyboard.press("Home")  # move the slider to step 0
    page.wait_for_function(f"/step 0:/.test(document.querySelector('{TREE_TITLE}').textContent)")
    assert tree_step(page) == 0
    assert page.locator(TREE_POINTS).count() > 2
    assert page.locator("#talon-text .step.sel").get_attribute("data-step") == "0"

    page.locator("#talon-next").click()
    page.wait_for_function(f"/step 1:/.test(document.querySelector('{TREE_TITLE}').textContent)")

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "browser-run.png"), full_page=True)


def test_hostile_prompt_renders_as_text(page) -> None:
    """A prompt full of markup runs; nothing from it becomes live markup on the page."""
    page.fill("#talon-prompt textarea", '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned=2">')
    page.click("#talon-run")
    page.wait_for_selector("#talon-summary .detail")
    assert page.evaluate("window.__pwned === undefined")
    assert page.locator("#talon-text script, #talon-text img").count() == 0
