"""The knob table (``talon.knobs``) is the one declaration of every knob: the records' fields and
defaults come from it, and no other module declares a knob, adds its flag or range-checks it."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import shutil
from pathlib import Path

import pytest

from talon.atlas.explorer import Knobs
from talon.atlas.sweep import GRID
from talon.cli.args import add_run_args, config_from_args
from talon.knobs import APP_KNOBS, KNOB, KNOBS, ConfigError, markdown_table
from talon.run_config import RetrievalConfig, RunConfig, SamplingConfig, TreeConfig
from talon.server.controls import Controls
from tests.tiny import REPO

RECORDS = {"": RunConfig, "tree": TreeConfig, "retrieval": RetrievalConfig, "sampling": SamplingConfig}


def test_every_record_field_is_a_knob_with_the_tables_default() -> None:
    for section, record in RECORDS.items():
        fields = {f.name: f for f in dataclasses.fields(record) if f.name not in RECORDS}
        knobs = {k.field: k for k in KNOBS if k.section == section}
        assert set(fields) == set(knobs), f"{record.__name__}: fields and knobs differ"
        made = record()
        for name, knob in knobs.items():
            assert getattr(made, name) == knob.default, f"{record.__name__}.{name}"


def test_the_front_ends_take_their_knobs_from_the_table() -> None:
    parser = argparse.ArgumentParser()
    add_run_args(parser)
    assert config_from_args(parser.parse_args([])) == RunConfig() == Controls().to_config(10**6)
    assert {k.name for k in KNOBS if k.grid} == set(GRID)
    assert {f.name for f in dataclasses.fields(Knobs)} == {k.name for k in KNOBS if k.explore}
    assert {f.name for f in dataclasses.fields(Controls)} - {"preset", "draft_quant", "target_weights"} == {
        k.app for k in KNOBS if k.app}
    # every knob, one name: the flag, the explorer, the controls and the record agree on a change
    changed = RunConfig().with_knobs({"budget": "24", "tree": "chain", "graft_threshold": 5.0, "cost_aware": "off"})
    args = parser.parse_args(["--budget", "24", "--tree", "chain", "--graft-threshold", "5", "--cost-aware", "off"])
    assert config_from_args(args) == changed
    assert Controls.from_config(changed.to_dict()).to_config(10**6) == changed
    assert changed.knob_values()["graft_threshold"] == 5 and changed.retrieval.graft_threshold == 5


@pytest.mark.parametrize(("flags", "message"), [
    (["--drafter", "hybrid", "--mtp-layers", "chained"], "--mtp-layers chained changes nothing with --drafter "
     "hybrid: only mtp, mtp-hybrid read it"),
    (["--drafter", "model", "--skip-layers", "0.5"], "--skip-layers 0.5 changes nothing .* only layerskip"),
    (["--drafter", "model", "--retrieval-min-match", "4"], "only hybrid, retrieval, eagle3-hybrid, mtp-hybrid"),
    (["--drafter", "retrieval", "--graft-threshold", "5"], "only hybrid, eagle3-hybrid, mtp-hybrid read it"),
    (["--drafter", "none", "--corpus", "notes.txt"], "--corpus notes.txt changes nothing"),
])
def test_a_flag_the_drafter_never_reads_is_refused(flags: list[str], message: str) -> None:
    parser = argparse.ArgumentParser()
    add_run_args(parser)
    args = parser.parse_args(flags)
    with pytest.raises(ConfigError, match=message):
        config_from_args(args, one_drafter=True)
    assert config_from_args(args) is not None  # a sweep's base command may carry it for another drafter


def test_generate_refuses_an_unread_flag_before_any_model_loads(caplog: pytest.LogCaptureFixture) -> None:
    from talon.cli.main import main

    argv = ["generate", "--prompt", "hi", "--target", "no/such-model", "--mtp-layers", "chained"]
    assert main(argv) == 2
    assert "--mtp-layers chained changes nothing with --drafter hybrid" in caplog.text


def test_a_flag_the_drafter_reads_or_left_at_its_default_passes() -> None:
    parser = argparse.ArgumentParser()
    add_run_args(parser)
    for flags in (["--drafter", "mtp", "--mtp-layers", "chained"], ["--drafter", "layerskip", "--skip-layers", "0.5"],
                  ["--drafter", "mtp-hybrid", "--graft-threshold", "5"], ["--drafter", "model", "--skip-layers", "0.3"],
                  ["--drafter", "retrieval", "--corpus", "notes.txt", "--retrieval-branches", "4"]):
        config_from_args(parser.parse_args(flags), one_drafter=True)


@pytest.mark.parametrize(("values", "message"), [
    ({"budget": 0}, r"budget must be an integer in \[1, 256\], got 0"),
    ({"budget": 2.5}, "budget must be an integer, got 2.5"),
    ({"mu": "x"}, "mu must be a number, got 'x'"),
    ({"tree": "bushy"}, "tree mode must be one of"),
    ({"cost_aware": "maybe"}, "cost_aware must be true or false"),
    ({"warp": 1}, "unknown knob 'warp'"),
])
def test_a_bad_value_is_named_once_for_every_front_end(values: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunConfig().with_knobs(values)


def test_the_docs_flag_table_is_the_tables() -> None:
    assert markdown_table() in (REPO / "docs" / "cli.md").read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Declared once: no other module declares a knob's default, adds its flag or checks its range
# ---------------------------------------------------------------------------------------------

KNOB_WORDS = {w for k in KNOBS for w in (k.name, k.words, k.app, k.field) if w}
OPTIONS = {k.option for k in KNOBS} | {f"--no-{k.option[2:]}" for k in KNOBS if k.cli == "pair"}
# modules that hold front ends' or records' knobs: a literal default there is a second declaration
KNOB_READERS = ("talon/run_config.py", "talon/ui/", "talon/server/", "talon/cli/", "talon/atlas/explorer.py",
              "talon/atlas/sweep.py", "talon/bench/")


def declared_elsewhere(root: Path = REPO) -> set[str]:
    found = set()
    for path in [*sorted((root / "talon").rglob("*.py")), root / "app.py"]:
        name = str(path.relative_to(root))
        if name == "talon/knobs.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and first.value in OPTIONS:
                    found.add(f"{name}: flag {first.value}")
            elif isinstance(node, ast.ClassDef) and name.startswith(KNOB_READERS):
                for item in node.body:
                    if (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                            and item.target.id in KNOB_WORDS and isinstance(item.value, ast.Constant)
                            and item.value.value is not None):  # None: a column, not a default
                        found.add(f"{name}: {node.name}.{item.target.id} = {item.value.value!r}")
            elif isinstance(node, (ast.Constant, ast.JoinedStr)):
                head = node.value if isinstance(node, ast.Constant) else (
                    node.values[0].value if node.values and isinstance(node.values[0], ast.Constant) else "")
                if isinstance(head, str) and any(head.startswith(f"{w} must be") for w in KNOB_WORDS):
                    found.add(f"{name}: checks {head.split(' must')[0]}")
    return found


def test_no_knob_is_declared_or_range_checked_outside_the_table() -> None:
    assert declared_elsewhere() == set()


def test_a_second_declaration_is_caught(tmp_path: Path) -> None:
    shutil.copytree(REPO / "talon", tmp_path / "talon", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "app.py", tmp_path / "app.py")
    with (tmp_path / "talon" / "cli" / "args.py").open("a", encoding="utf-8") as fh:
        fh.write('\n\ndef more(p):\n    p.add_argument("--budget", type=int, default=16)\n')
    with (tmp_path / "talon" / "server" / "request.py").open("a", encoding="utf-8") as fh:
        fh.write('\n\nclass Extra:\n    budget: float = 16\n\n\ndef check(v):\n'
                 '    if v > 1:\n        raise ValueError(f"mu must be a number in [0, 1], got {v}")\n')
    assert declared_elsewhere(tmp_path) == {"talon/cli/args.py: flag --budget",
                                            "talon/server/request.py: Extra.budget = 16",
                                            "talon/server/request.py: checks mu"}
    assert KNOB["mu"].option == "--mu"


def test_the_controls_record_holds_every_app_knob_under_its_app_name_and_default() -> None:
    import dataclasses

    from talon.server.controls import Controls

    fields = dataclasses.fields(Controls)
    knobs = [f for f in fields if f.name not in ("preset", "draft_quant", "target_weights")]
    assert [f.name for f in knobs] == [k.app for k in APP_KNOBS]
    assert [f.default for f in knobs] == [k.default for k in APP_KNOBS]
    assert fields[0].name == "preset" and [f.name for f in fields[-2:]] == ["draft_quant", "target_weights"]
