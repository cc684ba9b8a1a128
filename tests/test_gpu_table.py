"""docs/gpu.md's predicted GPU table is a prediction from the
committed curves (``data/gpu_costs``) replayed on the bundled lesson atlases: each figure must be
what ``python -m talon atlas sweep`` predicts from them today, so a changed curve, planner or atlas
cannot leave the table stale."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from talon.cli.main import main
from talon.cost.model import CostModel
from tests.tiny import REPO

ROWS = {"eager (probed)": "eager", "CUDA graphs, the default (probed)": "graph",
        "graphs, draft compiled (derived: 11 of 12 draft sizes scaled from one)": "compiled"}
TABLE_DRAFTERS = ("none", "retrieval", "model", "hybrid")


def gpu_doc_rows() -> dict[str, list[float]]:
    """The H100 table's tok/s per row, in the order none, retrieval, model, hybrid."""
    rows = {}
    for line in (REPO / "docs" / "gpu.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] in ROWS:
            rows[ROWS[cells[0]]] = [float(re.sub(r"[^0-9.]", "", c.replace("tok/s", ""))) for c in cells[1:5]]
    return rows


def predicted(curve: Path, capsys: pytest.CaptureFixture[str]) -> list[float]:
    assert main(["atlas", "sweep", str(REPO / "data" / "lessons"), "--costs", str(curve),
                 "--grid", "drafter=" + ",".join(TABLE_DRAFTERS), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    by = {r["values"]["drafter"]: r["tokens_per_s"] for r in rows}
    return [by[d] for d in TABLE_DRAFTERS]


def test_the_gpu_doc_table_is_the_sweep_of_the_committed_curves(capsys: pytest.CaptureFixture[str]) -> None:
    rows = gpu_doc_rows()
    assert set(rows) == set(ROWS.values()), "every row of docs/gpu.md's H100 table was found"
    for label, figures in rows.items():
        curve = REPO / "data" / "gpu_costs" / f"h100-80gb-hbm3-{label}-qwen2.5-7b.cost.json"
        CostModel.from_dict(json.loads(curve.read_text()))  # a valid talon-cost/1 file
        want = predicted(curve, capsys)
        assert figures == pytest.approx(want, abs=0.06), f"{label}: docs/gpu.md says {figures}, the sweep {want}"


def test_the_what_if_rows_start_from_the_committed_curve_and_pay_for_a_cheaper_draft(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``experiments/gpu_whatif.py`` (docs/gpu.md's what-if table): its first row is docs/gpu.md's
    compiled row, and every cheaper draft forward predicts at least as much for hybrid."""

    from experiments.gpu_whatif import main as whatif

    curve = REPO / "data" / "gpu_costs" / "h100-80gb-hbm3-compiled-qwen2.5-7b.cost.json"
    assert whatif([str(curve), "--bare-ms", "1.545"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    hybrid = [float(line.strip("|").split("|")[6]) for line in lines]
    assert hybrid[0] == pytest.approx(gpu_doc_rows()["compiled"][3], abs=0.06)
    assert len(hybrid) == 6 and hybrid == sorted(hybrid)
