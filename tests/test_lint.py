"""The linter's configuration has teeth: the tree is clean, and a planted unused import fails the
same command ``scripts/test.sh`` runs before the suite (so ``.ci/run`` fails on it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.tiny import REPO

LINT = [sys.executable, "-m", "ruff", "check", "--no-cache", "."]


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(LINT, cwd=root, capture_output=True, text=True, timeout=120)


def test_the_tree_is_lint_clean() -> None:
    done = lint(REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_the_test_script_lints_before_the_suite() -> None:
    script = (REPO / "scripts" / "test.sh").read_text(encoding="utf-8")
    assert script.index("-m ruff check") < script.index("-m pytest")


def test_a_planted_unused_import_fails_the_lint(tmp_path: Path) -> None:
    for name in ("talon", "tests", "scripts", "experiments"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("app.py", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    assert lint(tmp_path).returncode == 0
    kv = tmp_path / "talon" / "core" / "kv.py"
    kv.write_text("import os\n" + kv.read_text(encoding="utf-8"), encoding="utf-8")
    done = lint(tmp_path)
    assert done.returncode == 1 and "F401" in done.stdout and "talon/core/kv.py" in done.stdout
