"""The Threshold explorer in a real browser: Playwright drives Debian's chromium against
``python app.py`` on tiny models. Record an atlas of the prompt, move a knob and see the score and
the heatmaps redraw (timed), move the knobs to the best, apply them to the controls on the left,
and scrub the replayed steps' tree. A screenshot goes to /tmp/atlas_tab.png."""

from __future__ import annotations

import logging
import time

import pytest

from tests.browser import SCREENSHOTS, TINY_PROMPT, wait_for_recording
from tests.tiny import app_log_tail

pytestmark = pytest.mark.browser
logger = logging.getLogger(__name__)

SCREENSHOT = str(SCREENSHOTS / "atlas-tab.png")
RECORD_TIMEOUT_MS = 240_000  # tiny models on a loaded 2-core CPU
SCORE = "#talon-atlas-score"
STAT = f"{SCORE} .stat .v"
PLOT = "document.querySelector('#talon-atlas-{}-mat .js-plotly-plot')"
WATCH_PROGRESS = """() => {
  const status = document.querySelector('#talon-atlas-status');
  window.talonProgressSeen = false;
  new MutationObserver(() => { window.talonProgressSeen ||= status.querySelector('.talon-progress') !== null; })
    .observe(status, {childList: true, subtree: true, characterData: true});
}"""


def score(page) -> list[str]:
    """The explorer's numbers: MAT, predicted tokens/s, step time, steps, coverage."""
    return [v.strip() for v in page.locator(STAT).all_text_contents()]


def slider(page, elem_id: str):
    return page.locator(f"#{elem_id} input[type=range]")


def test_record_explore_find_the_best_apply_and_view_a_step(page) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    wait_for_recording(page)  # the controls are set from the recording (48 new tokens)
    page.fill("#talon-prompt textarea", TINY_PROMPT)
    page.get_by_role("tab", name="Threshold explorer").click()
    assert "No atlas yet" in (page.locator("#talon-atlas-status").text_content() or "")

    # progress streams: seen by an observer of every change to the status (a poll may miss a short
    # recording's bar, or come after it)
    page.evaluate(WATCH_PROGRESS)
    page.click("#talon-atlas-record")
    try:
        page.wait_for_function("document.querySelector('#talon-atlas-status').textContent.includes('Atlas of')",
                               timeout=RECORD_TIMEOUT_MS)
    except PlaywrightTimeout:
        status = page.locator("#talon-atlas-status").text_content()
        pytest.fail(f"no atlas after {RECORD_TIMEOUT_MS / 1000:.0f} s; the status says {status!r}; the app's log "
                    f"ends:\n{app_log_tail(page.url)}")
    assert page.evaluate("window.talonProgressSeen"), "the recording streamed no progress bar"
    page.wait_for_function(f"document.querySelectorAll('{STAT}').length === 5")
    assert page.locator("#talon-atlas-download a").count() >= 1, "the atlas downloads"
    before = score(page)

    # a knob moves: the score and the heatmaps redraw from the atlas, no model
    budget = slider(page, "talon-atlas-budget")
    budget.focus()
    start = time.perf_counter()
    page.keyboard.press("Home")  # N = 1
    page.wait_for_function(f"{PLOT.format('mu')}.data[0].x.includes('1')")
    page.wait_for_function(f"{PLOT.format('k')}.data.some(t => t.name === 'sliders')")
    elapsed = time.perf_counter() - start
    logger.warning("knob move to redrawn score and heatmaps: %.2f s", elapsed)
    print(f"\nknob move -> redrawn heatmaps: {elapsed:.2f} s")
    after = score(page)
    assert after != before, (before, after)
    assert elapsed < 5.0, f"a knob move took {elapsed:.1f} s to redraw"

    # the best, marked and in words; move the knobs there, then apply them on the left
    assert "best found" in (page.locator(SCORE).text_content() or "")
    page.click("#talon-atlas-to-best")
    page.wait_for_function(f"document.querySelector('{SCORE}').textContent.includes('moved to the best')")
    best_budget = budget.input_value()
    page.click("#talon-atlas-apply")
    page.wait_for_function("document.querySelector('#talon-atlas-status').textContent.includes('Applied the knobs')")
    left_budget = page.locator("#talon-controls input"
                               "[aria-label='range slider for Budget N (nodes verified per step)']")
    assert left_budget.input_value() == best_budget

    # a replayed step's tree
    step = slider(page, "talon-atlas-step")
    step.focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_function("/step 1:/.test(document.querySelector('#talon-atlas-tree .gtitle').textContent)")
    assert page.locator("#talon-atlas-tree .scatterlayer .trace .point").count() >= 2
    page.locator("#talon-atlas-mu-mat").scroll_into_view_if_needed()
    page.screenshot(path=SCREENSHOT, full_page=True)

    # adaptive draft length: every rule ranked beside TALON, one rule drawn against the oracle
    rules = page.locator("#talon-atlas-rules").text_content() or ""
    assert all(name in rules for name in ("talon", "fixed", "hf-heuristic", "sglang-adaptive", "vllm-dsd")), rules
    page.locator("#talon-atlas-rule label", has_text="sglang-adaptive").click()
    page.wait_for_function("document.querySelector('#talon-atlas-lengths .gtitle').textContent"
                           ".startsWith('sglang-adaptive')")
    assert page.locator("#talon-atlas-lengths .legendtext", has_text="oracle").count() == 1
    page.locator("#talon-atlas-lengths").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "atlas-adaptive.png"), full_page=False)

    # Serve it: the engines' own drafting replayed on this atlas, beside Talon's MAT
    page.get_by_role("tab", name="Serve it").click()
    page.click("#talon-serve-run")
    page.wait_for_function("document.querySelector('#talon-serve-forecast').textContent.includes('Best engine')")
    forecast = page.locator("#talon-serve-forecast").text_content() or ""
    assert "Talon, the current controls" in forecast and "MAT" in forecast
    assert "vLLM draft_model, k=" in forecast and "mean acceptance length" in forecast
    assert "SGLang STANDALONE" in forecast and "spec_accept_length" in forecast
    assert "Reading the numbers" in forecast
    assert "Adaptive draft length on this atlas" in forecast and "speculative-adaptive" in forecast
    page.locator("#talon-serve-forecast").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "serve-forecast.png"), full_page=False)


def test_an_eagle3_heads_atlas_uploads_and_explores(page, head_atlas_file, model_atlas_file) -> None:  # noqa: F811
    """An atlas recorded with an EAGLE-3 head: the drafter offers the head's kinds, the heatmaps
    and the best configuration replay the head (``eagle3-hybrid`` for the default ``hybrid``);
    in Lessons, with the same prompt's draft-model atlas uploaded, the head against the model."""
    page.get_by_role("tab", name="Threshold explorer").click()
    page.locator("#talon-atlas-upload input[type=file]").set_input_files(str(head_atlas_file))
    page.wait_for_function("document.querySelector('#talon-atlas-status').textContent.includes('EAGLE-3 head')")
    page.wait_for_function(f"document.querySelectorAll('{STAT}').length === 5")
    page.wait_for_function(f"{PLOT.format('mu')} && {PLOT.format('mu')}.data.length > 0")
    page.wait_for_function(f"{PLOT.format('k')} && {PLOT.format('k')}.data.length > 0")
    drafter = page.locator("#talon-atlas-drafter")
    labels = [t.strip() for t in drafter.locator("label").all_text_contents()]
    assert labels == ["retrieval", "eagle3", "eagle3-hybrid"], labels
    assert drafter.locator("input[value='eagle3-hybrid']").is_checked()
    assert "best found" in (page.locator(f"{SCORE} .talon-best").text_content() or "")
    page.click("#talon-atlas-to-best")
    page.wait_for_function(f"document.querySelector('{SCORE}').textContent.includes('moved to the best')")
    assert drafter.locator("input[value='eagle3-hybrid']").is_checked()  # the best replays the head
    page.locator("#talon-atlas-mu-mat").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "atlas-head.png"), full_page=True)

    page.get_by_role("tab", name="Lessons").click()
    page.locator("#talon-lesson-head-files input[type=file]").set_input_files(str(model_atlas_file))
    page.wait_for_function("document.querySelector('#talon-lesson-head-text').textContent.includes('tokens per step')")
    page.wait_for_selector("#talon-lesson-head .js-plotly-plot")
    page.locator("#talon-lesson-head").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "lesson-head.png"), full_page=False)
