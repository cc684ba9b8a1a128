"""Driving Debian's chromium with Playwright: where it is, how it starts, and what the browser
tests wait for (the ``page`` fixture is conftest.py's)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.tiny import REPO

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


TREE_TITLE = "#talon-tree .gtitle"


def require_chromium() -> None:
    """Missing chromium fails the test in CI (CI=true) and skips it elsewhere."""
    if CHROMIUM.exists():
        return
    message = f"{CHROMIUM} not found: apt-get install -y chromium"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def tree_step(page) -> int:
    """The step number in the tree figure's title ("Draft tree, step N: ...")."""
    match = re.search(r"step (\d+)", page.locator(TREE_TITLE).text_content() or "")
    assert match, "the tree plot has no step title"
    return int(match.group(1))


def wait_for_recording(page) -> None:
    """The shipped recording is on screen (so a click on Run replaces it, not the reverse)."""
    # the page may not have rendered the summary yet: wait for it, not only for its text
    page.wait_for_function("(document.querySelector('#talon-summary')?.textContent || '').includes('RECORDING')")


TINY_PROMPT = "Repeat: one two three, one two three, one two three."  # the tiny models' context is short
