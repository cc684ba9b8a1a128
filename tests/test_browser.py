"""The app in a real browser: Playwright drives Debian's chromium against ``python app.py`` on
tiny models. Run the default example, see streamed text and a tree plot with nodes, move the
step slider and see the plot change; a screenshot goes to out/screenshots/."""

from __future__ import annotations

import re

import pytest

from talon.ui.recording import load_recording
from tests.browser import SCREENSHOTS, TINY_PROMPT, TREE_TITLE, tree_step, wait_for_recording

pytestmark = pytest.mark.browser

TREE_POINTS = "#talon-tree .scatterlayer .trace .point"










RUN_FINISHED = (
    "document.querySelector('#talon-summary .detail') !== null"
    " && !document.querySelector('#talon-summary').textContent.includes('RECORDING')"
)




TREE_DATA = "document.querySelector('#talon-tree .js-plotly-plot').data"


def test_first_view_is_a_recording_that_works_before_any_run(page) -> None:
    wait_for_recording(page)
    page.wait_for_function(f"document.querySelectorAll('{TREE_POINTS}').length > 2")
    assert page.locator("#talon-text .tk").count() >= 16
    assert page.locator("#talon-inspector table").count() >= 1  # the inspector shows a node already
    # it opens on a step that teaches: a branching tree from both sources, a gate, a rejection
    names = set(page.evaluate(f"{TREE_DATA}.map(t => t.name)"))
    assert "draft model" in names and names & {"retrieval", "model + retrieval"}, names
    assert "target token after a rejection" in names
    symbols = page.evaluate(f"{TREE_DATA}.flatMap(t => (t.marker && Array.isArray(t.marker.symbol))"
                            " ? t.marker.symbol : [])")
    assert "circle-x" in symbols, "a node the gate cut"
    parents = page.evaluate(f"{TREE_DATA}.filter(t => t.customdata).flatMap(t => t.customdata)")
    assert len(parents) >= 4
    summary, _ = load_recording()
    assert page.input_value("#talon-prompt textarea") == summary.prompt, "Run repeats the recording"
    first = tree_step(page)
    slider = page.locator("#talon-slider input[type=range]")
    slider.focus()
    page.keyboard.press("Home")
    page.wait_for_function(f"/step 0:/.test(document.querySelector('{TREE_TITLE}').textContent)")
    assert first > 0, "the opening step is not the first one here"
    pick_node(page, 1)
    page.wait_for_function("/node 1/.test(document.querySelector('#talon-inspector').textContent)")
    assert "position id" in (page.locator("#talon-inspector").text_content() or "")
    assert page.locator("#talon-mask .ytick text").first.text_content().endswith(tuple("0123456789"))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "first-view.png"), full_page=True)


def pick_node(page, index: int) -> None:
    """Choose the ``index``-th entry of the node inspector's dropdown."""
    page.locator("#talon-node-pick input").click()
    page.locator("ul[role=listbox] li").nth(index).click()




def test_run_streams_text_and_tree_and_the_slider_replots(page) -> None:
    wait_for_recording(page)
    page.fill("#talon-prompt textarea", TINY_PROMPT)
    # every step drafts a tree (cost-aware planning may rightly skip drafting on tiny models)
    page.locator("#talon-cost-aware input[type=checkbox]").uncheck()
    page.click("#talon-run")
    page.wait_for_function(RUN_FINISHED)  # the run's summary: it has finished
    page.wait_for_selector("#talon-text .tk")  # streamed text with provenance spans
    page.wait_for_function(f"document.querySelectorAll('{TREE_POINTS}').length > 2")
    assert page.locator("#talon-text .tk").count() >= 16
    assert page.locator("#talon-text .tk.src-bonus, #talon-text .tk.src-resampled").count() >= 1
    assert page.locator("#talon-inspector table").count() >= 1
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
    wait_for_recording(page)
    page.fill("#talon-prompt textarea", '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned=2">')
    page.click("#talon-run")
    page.wait_for_function(RUN_FINISHED)
    assert page.evaluate("window.__pwned === undefined")
    assert "<script>window.__pwned = 1</script>" in (page.locator("#talon-summary").text_content() or ""), \
        "the summary shows the prompt, as text"
    assert page.locator("#talon-text script, #talon-text img, #talon-summary script, #talon-summary img").count() == 0


WALK_HEAD = "#talon-walk .talon-walk-head"


def test_the_guided_walk_goes_through_every_stop_and_back(page) -> None:
    from talon.figures import WALK

    wait_for_recording(page)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.click("#talon-walk-start")
    for i, stop in enumerate(WALK):
        if i:
            page.click("#talon-walk-next")
        page.wait_for_function(f"(document.querySelector('{WALK_HEAD}') || {{}})"
                               f".textContent?.startsWith('{i + 1} / {len(WALK)}')")
        page.wait_for_function(f"document.getElementById('{stop.focus}').classList.contains('talon-focus')")
        assert page.locator(".talon-focus").count() == 1
        assert page.locator("#talon-walk").is_visible(), "the card stays in view"
        if i == 1:
            page.screenshot(path=str(SCREENSHOTS / "walk.png"))
        if stop.key == "predict":
            _predict_then_check(page)
    for i in range(len(WALK) - 2, -1, -1):
        page.click("#talon-walk-back")
        page.wait_for_function(f"document.querySelector('{WALK_HEAD}').textContent.startsWith('{i + 1} / {len(WALK)}')")
        page.wait_for_function(f"document.getElementById('{WALK[i].focus}').classList.contains('talon-focus')")
    page.click("#talon-walk-leave")
    page.wait_for_function("!document.querySelector('#talon-walk .talon-walk-card')"
                           " || document.querySelector('#talon-walk').offsetParent === null")
    page.wait_for_function("document.querySelectorAll('.talon-focus').length === 0")


def _predict_then_check(page) -> None:
    """The walk's question: the tree's colours and the text are veiled and the verdict hidden until
    an answer is pressed; then the right answer is marked and the veil lifts."""
    veiled = "getComputedStyle(document.getElementById('talon-tree')).filter"
    blurred = "getComputedStyle(document.getElementById('talon-text')).filter"
    page.wait_for_function(f"{veiled}.includes('grayscale')")
    assert "blur" in page.evaluate(blurred)
    assert not page.locator("#talon-walk .talon-answer").is_visible()
    page.screenshot(path=str(SCREENSHOTS / "walk_predict.png"))
    page.locator("#talon-walk .talon-choice").last.click()
    page.wait_for_selector("#talon-walk .talon-answer", state="visible")
    assert page.locator("#talon-walk .talon-choice.talon-is-right").count() == 1
    assert "It kept" in (page.locator("#talon-walk .talon-answer").text_content() or "")
    page.wait_for_function(f"{veiled} === 'none'")


def test_a_run_that_skipped_the_draft_model_offers_the_full_tree(page) -> None:
    """Tiny random models accept almost nothing, so cost-aware planning skips the draft model on
    most steps: the summary says so and one click runs again with cost-aware planning off."""
    wait_for_recording(page)
    assert not page.locator("#talon-full-tree").is_visible()
    page.fill("#talon-prompt textarea", TINY_PROMPT)
    cost_aware = page.locator("#talon-cost-aware input[type=checkbox]")
    cost_aware.check()  # the recording was made with planning off; the page set the box so
    page.click("#talon-run")
    page.wait_for_function(RUN_FINISHED)
    page.wait_for_selector("#talon-full-tree", state="visible")
    assert "skipped the draft model" in (page.locator("#talon-summary").text_content() or "")
    page.click("#talon-full-tree")
    page.wait_for_function("!document.querySelector('#talon-summary').textContent.includes('skipped the draft model')"
                           " && document.querySelector('#talon-summary .detail') !== null")
    assert not cost_aware.is_checked(), "the re-run turned cost-aware planning off"
    assert not page.locator("#talon-full-tree").is_visible()
    assert "steps without the draft model 0" in (page.locator("#talon-summary").text_content() or "")


def test_serve_tab_translates_the_controls(page) -> None:
    page.get_by_role("tab", name="Serve it").click()
    page.click("#talon-serve-run")
    page.wait_for_function("/speculative-config/.test(document.querySelector('#talon-serve').textContent)")
    text = page.locator("#talon-serve").text_content() or ""
    assert "sglang.launch_server" in text and "vllm serve" in text
    assert "does not carry over" in text.lower() or "not carried" in text.lower()
    assert "Threshold explorer" in (page.locator("#talon-serve-forecast").text_content() or "")


def test_lessons_tab_replays_the_papers_claims_with_no_model(page) -> None:
    """One click from the first view: the lessons on the bundled atlases, a prompt and a budget
    picked, the numbers in words beside the figures."""
    wait_for_recording(page)
    page.get_by_role("tab", name="Lessons").click()
    page.wait_for_function("document.querySelector('#talon-lesson-adaptive')"
                           ".textContent.includes('static tree accepts')")
    page.wait_for_selector("#talon-lesson-depth .js-plotly-plot")
    first = page.locator("#talon-lesson-adaptive").text_content() or ""
    assert "TALON's adaptive tree" in first and "N = 59" in first and "best single depth" in first
    assert "retrieval alone" in (page.locator("#talon-lesson-hybrid").text_content() or "")
    assert page.locator("#talon-lesson-carried .lesson-step").count() >= 3
    assert "H100's measured curves" in (page.locator("#talon-lesson-async").text_content() or "")
    page.wait_for_selector("#talon-lesson-timeline .js-plotly-plot")
    page.locator("#talon-lesson-budget label", has_text="16").click()
    page.wait_for_function("document.querySelector('#talon-lesson-adaptive').textContent.includes('N = 16')")
    page.locator("#talon-lesson-prompt input").click()
    # the first sum prompt (suites in Spec-Bench's order): retrieval carries it
    page.get_by_role("option").nth(8).click()
    page.wait_for_function("document.querySelector('#talon-lesson-hybrid').textContent.includes('retrieval alone 2.')")
    page.wait_for_function("document.querySelector('#talon-lesson-carried').textContent.includes('bonus token only')")
    page.wait_for_selector("#talon-lesson-calibration .js-plotly-plot")
    assert "path confidence 0.7 or more" in (page.locator("#talon-lesson-calibration-text").text_content() or "")
    # the exercises: each verdict shows once an answer is pressed, the replay's answer marked
    tasks = page.locator("#talon-lesson-exercises .talon-predict")
    assert tasks.count() == 3
    assert not tasks.first.locator(".talon-answer").is_visible()
    tasks.first.locator(".talon-choice").first.click()
    tasks.first.locator(".talon-answer").wait_for(state="visible")
    assert tasks.first.locator(".talon-choice.talon-is-right").count() == 1
    assert "mean deepest layer" in (tasks.first.locator(".talon-answer").text_content() or "")
    page.screenshot(path=str(SCREENSHOTS / "lessons-tab.png"), full_page=True)
    # who adapts better: the tree's confidence against the acceptance history, in words and a figure
    lengths = page.locator("#talon-lesson-lengths-text").text_content() or ""
    assert "is the fastest" in lengths and "transformers' heuristic" in lengths and "SGLang" in lengths, lengths
    page.wait_for_selector("#talon-lesson-lengths .js-plotly-plot")
    page.locator("#talon-lesson-lengths").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "lesson-lengths.png"), full_page=False)
    page.click("#talon-lesson-export")  # one click: the run, its walk and these lessons as one file
    link = page.locator("#talon-lesson-download a")
    link.first.wait_for()
    assert (link.first.get_attribute("href") or "").endswith(".html")


def test_the_first_view_shows_the_payoff_beside_plain_decoding(page) -> None:
    """The opening recording's speed beside plain decoding's (from its cost curve, labelled so),
    faster, and the timeline's plain-decoding lane on the same clock."""
    wait_for_recording(page)
    summary_text = page.locator("#talon-summary").text_content() or ""
    assert "plain decoding tokens/s (from the cost curve)" in summary_text and "vs plain decoding" in summary_text
    ratio = float(re.search(r"≈ ([0-9.]+)×\s*vs plain decoding", summary_text).group(1))
    assert ratio > 1.0, f"the first screen's run must beat plain decoding: {ratio}"
    page.locator("#talon-timeline").scroll_into_view_if_needed()
    page.wait_for_function("document.querySelector('#talon-timeline .js-plotly-plot') !== null")
    lanes = page.evaluate("document.querySelector('#talon-timeline .js-plotly-plot').data.map(t => t.name)")
    assert "plain decoding" in lanes


def test_a_sampled_recording_draws_the_acceptance_rule_with_no_model(page) -> None:
    wait_for_recording(page)
    page.click("#talon-sampled")
    page.wait_for_function("(document.querySelector('#talon-summary')?.textContent || '').includes('SAMPLED')")
    page.wait_for_function("/sampled/.test(document.querySelector('#talon-acceptance .gtitle')?.textContent || '')")
    names = page.evaluate("document.querySelector('#talon-acceptance .js-plotly-plot').data.map(t => t.name)")
    assert names[:2] == ["target p", "draft q"] and any(n.startswith("chance kept") for n in names), names
    assert "min(1, p(x)/q(x))" in (page.locator("#talon-rule").text_content() or "")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "sampled-acceptance.png"), full_page=True)
