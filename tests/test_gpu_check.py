"""scripts/gpu_check.py, shrunk (``--tiny``): the GPU check's every path runs on the CPU in the
suite, so the script cannot rot before a GPU runs it; and a planted bug makes it fail."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from talon.tree import DraftTree

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_tiny_gpu_check_passes_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["ok"] and report["tiny"] and set(report["pairs"]) == {
        "qwen2.5-7b", "qwen2.5-coder-7b", "llama-3.1-8b", "qwen2.5-14b"}
    qwen = report["pairs"]["qwen2.5-7b"]
    assert qwen["target_vocab"] - qwen["draft_vocab"] == 152_064 - 151_936  # the real pair's difference
    names = {c["name"] for c in qwen["checks"]}
    assert len(names) == 8 and all(c["ok"] for c in qwen["checks"])
    assert report["app"][0]["ok"] and report["app"][0]["detail"]["figures"] >= 5
    assert "| qwen2.5-14b |" in proc.stdout


def test_a_planted_bug_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_check = load_script()
    real = DraftTree.positions
    monkeypatch.setattr(DraftTree, "positions",
                        lambda self, prefix: real(self, prefix + 1) - (torch.tensor(self.depths) == 0).long())
    report = gpu_check.run_checks(tiny=True, only={"llama-3.1-8b"}, with_app=False)
    assert not report["ok"]
    lossless = report["pairs"]["llama-3.1-8b"]["checks"][0]
    assert lossless["name"].startswith("lossless") and not lossless["ok"] and lossless["detail"]["failures"]


def test_without_cuda_the_full_check_says_to_use_tiny() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    proc = subprocess.run([sys.executable, str(SCRIPT)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--tiny" in proc.stderr
