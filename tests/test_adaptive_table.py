"""``scripts.adaptive_table``: the run files' table of adaptive rules, on the atlases' own cost
curves or on a cost file's (``--costs``): the same MAT, other times."""

from __future__ import annotations

import pytest

from scripts.adaptive_table import main
from tests.tiny import REPO

RUN_FILES = REPO / "docs" / "runs"


def table_rows(text: str) -> dict[str, list[str]]:
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows[1:]}


def test_the_table_predicts_on_a_cost_file_when_given_one(capsys: pytest.CaptureFixture[str]) -> None:
    atlases = [str(RUN_FILES / "2026-11-29-adaptive-30" / f"{name}.json.gz") for name in ("humaneval-0", "qa-0")]
    assert main(atlases) == 0
    own = table_rows(capsys.readouterr().out)
    assert main([*atlases, "--costs", str(RUN_FILES / "2026-11-29-adaptive-30-costs-prepacked.json")]) == 0
    other = table_rows(capsys.readouterr().out)
    assert set(own) == set(other) >= {"talon", "fixed", "sglang-adaptive", "hf-heuristic", "vllm-dsd"}
    assert own["fixed"][0] == other["fixed"][0]  # MAT at the defaults: what the atlas holds
    assert own["fixed"][1] != other["fixed"][1]  # tokens/s: the curves' prediction
