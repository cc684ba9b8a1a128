"""The repository stands alone: a copy of it, somewhere with nothing beside it, finds its own
benchmark prompts and the app's example prompts, and no file points outside the repository."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny import REPO

OUTSIDE = tuple("shared" + tail for tail in ("/data", "/DESIGN", "/STYLE")) + (".." + "/shared",)
SUITES = ("mt_bench", "humaneval", "gsm8k", "alpaca", "sum", "qa")

PROBE = """
import json, sys
from pathlib import Path
from talon.bench import SPECBENCH_SUITES, default_data_dir, load_prompts
from talon.server.examples import load_examples
from talon.specbench import SUITE_NAMES
data = default_data_dir()
prompts = load_prompts(data, SPECBENCH_SUITES, limit=2)
examples = load_examples()
print(json.dumps({
    "data": str(data),
    "suites": sorted({p.suite for p in prompts}),
    "prompts": len(prompts),
    "example_suites": sorted({e.suite for e in examples}),
    "suite_names": sorted(SUITE_NAMES.values()),
}))
"""


def _copy_repository(dest: Path) -> Path:
    """The repository's own files (no virtual environment, caches or git metadata)."""
    ignore = shutil.ignore_patterns(".git", ".venv", "__pycache__", ".pytest_cache", "bench-out", "out")
    shutil.copytree(REPO, dest, ignore=ignore)
    return dest


def test_bundled_prompts_are_the_six_suites() -> None:
    data = REPO / "data" / "specbench"
    assert (data / "README.md").read_text(encoding="utf-8").count("Apache License 2.0") >= 1
    for suite in SUITES:
        lines = (data / f"{suite}.jsonl").read_text(encoding="utf-8").splitlines()
        assert len(lines) >= 30, suite
        first = json.loads(lines[0])
        assert isinstance(first["turns"][0], str) and first["turns"][0].strip()


def test_a_copy_elsewhere_reads_its_own_data(tmp_path: Path) -> None:
    """Bench data loading and the app's examples, run from a copy outside the usual place."""
    copy = _copy_repository(tmp_path / "somewhere" / "talon-clone")
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=copy, capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(copy), "HOME": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(found["data"]) == copy / "data" / "specbench"
    assert found["suites"] == sorted(SUITES)
    assert found["prompts"] == 2 * len(SUITES)
    assert found["example_suites"] == found["suite_names"], "examples fell back to the built-ins"


@pytest.mark.parametrize("suffix", ["*.py", "*.md", "*.sh"])
def test_nothing_points_outside_the_repository(suffix: str) -> None:
    offenders = []
    for path in REPO.rglob(suffix):
        parts = set(path.relative_to(REPO).parts)
        if parts & {".venv", ".git", "node_modules"}:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if any(pattern in text for pattern in OUTSIDE):
            offenders.append(str(path.relative_to(REPO)))
    assert not offenders, f"these files point outside the repository: {offenders}"
