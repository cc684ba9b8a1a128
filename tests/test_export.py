"""One lesson as one HTML file (talon/figures/export.py, ``python -m talon export``): written from the
opening recording and a bundled lesson atlas, opened in Chromium from file:// with the network
blocked, the step slider, the walk and the lesson figures working; bad input refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from talon.cli.main import main
from talon.figures.export import export_html


@pytest.fixture(scope="module")
def lesson_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "lesson.html"
    assert main(["export", "--lesson", "8", "--budget", "16", "--out", str(out)]) == 0
    return out


def test_the_file_stands_alone(lesson_file: Path) -> None:
    page = lesson_file.read_text(encoding="utf-8")
    assert "<script src=" not in page and "<link " not in page, "nothing is fetched: Plotly and the data are inline"
    assert "Plotly" in page[:4_000_000] and 'id="talon-data"' in page
    assert "Why adaptive?" in page and "Why hybrid?" in page and "Why async?" in page


def test_bad_export_requests_are_refused(tmp_path: Path) -> None:
    assert main(["export", "--lesson", "99", "--out", str(tmp_path / "x.html")]) == 2
    (tmp_path / "bad.json").write_text("{}")
    assert main(["export", "--trace", str(tmp_path / "bad.json"), "--out", str(tmp_path / "y.html")]) == 2
    with pytest.raises(ValueError, match="nothing to export"):
        export_html(None, [])


@pytest.mark.browser
def test_the_exported_lesson_works_offline_from_file_url(lesson_file: Path, chromium) -> None:  # noqa: ANN001
    fetched: list[str] = []
    context = chromium.new_context(offline=True, viewport={"width": 1200, "height": 900})
    try:
        context.route("**/*", lambda route: (fetched.append(route.request.url), route.abort())
                      if not route.request.url.startswith("file://") else route.continue_())
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(lesson_file.as_uri())
        page.wait_for_selector("#tree.js-plotly-plot")  # Plotly marks the div it draws in
        title = page.locator("#tree .gtitle").text_content() or ""
        first = int(re.search(r"step (\d+)", title).group(1))
        slider = page.locator("#step")
        slider.focus()
        page.keyboard.press("Home")
        page.wait_for_function("/step 0/.test(document.querySelector('#tree .gtitle').textContent)")
        assert first != 0, "the page opens on the recording's instructive step, not step 0"
        assert "1 / 7" in (page.locator("#walk").text_content() or "")
        page.click("#next")
        assert "2 / 7" in (page.locator("#walk").text_content() or "")
        page.click("#next")
        page.click("#next")  # the question: the verdict shows once an answer is pressed
        assert not page.locator("#walk .talon-answer").is_visible()
        page.locator("#walk .talon-choice").first.click()
        page.wait_for_selector("#walk .talon-answer", state="visible")
        for fig in ("lesson-depth", "lesson-funnel", "lesson-calibration", "lesson-drafters", "lesson-async"):
            page.wait_for_selector(f"#{fig}.js-plotly-plot .main-svg")
        exercise = page.locator(".talon-predict").filter(has_text="Give the adaptive tree")
        exercise.locator(".talon-choice").first.click()  # the exercises answer offline too
        exercise.locator(".talon-answer").wait_for(state="visible")
        page.screenshot(path="/tmp/exported_lesson.png", full_page=True)
        assert not errors, errors
    finally:
        context.close()
    assert fetched == [], f"the file asked the network for {fetched}"
