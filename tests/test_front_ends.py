"""One engine for every front end (``talon.engine.build``): the command line runs the step the settings
name and says which ran, ``talon costs --probe`` measures the curves of that step, async drafting
has one default, and no front end builds an engine any other way."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from talon.cli.main import main
from talon.cost.model import CostModel
from talon.knobs import KNOB
from talon.settings import PROVEN, proven_default
from tests.tiny import REPO, tiny_loaded

FRONT_END_PATHS = ("talon/cli", "talon/bench", "talon/server", "talon/ui", "app.py")


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("pair")
    for name, seed in (("target", 0), ("draft", 1)):
        lm = tiny_loaded("qwen2", seed)
        lm.model.save_pretrained(root / name)
        lm.tokenizer.save_pretrained(root / name)
    return root / "target", root / "draft"


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("step,fold,path", [("static", "auto", "static+fold"), ("dynamic", "0", "dynamic")])
def test_generate_runs_the_configured_forward_and_says_so(pair_dirs: tuple[Path, Path], step: str, fold: str,
                                                      path: str, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TALON_FORWARD", step)
    monkeypatch.setenv("TALON_FOLD", fold)
    target, draft = pair_dirs
    out = run_cli(["generate", "--prompt", "abc abc", "--target", str(target), "--draft", str(draft), "--device",
                   "cpu", "--dtype", "float32", "--max-new-tokens", "6", "--no-chat-template", "--json"], capsys)
    summary = json.loads(out)
    assert summary["forward_path"] == path and len(summary["token_ids"]) == 6
    assert summary["config"]["async_draft"] is False  # the knob table's one default, on every device


def test_costs_probe_measures_the_configured_forward(pair_dirs: tuple[Path, Path], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TALON_FORWARD", "static")
    monkeypatch.setenv("TALON_COST_CACHE", str(tmp_path))
    target, draft = pair_dirs
    out = run_cli(["costs", "--refresh", "--target", str(target), "--draft", str(draft), "--device", "cpu",
                   "--dtype", "float32"], capsys)
    assert "forward=static+fold" in out
    (cached,) = tmp_path.glob("*.json")
    costs = CostModel.from_dict(json.loads(cached.read_text()))
    assert costs.key.endswith("|forward=static+fold") and costs.provenance.source == "probe"
    assert costs.provenance.field_source("verify_s") == "probe"
    assert costs.provenance.field_source("other_s").startswith("assumed")


def test_atlas_record_writes_the_pairs_atlas(pair_dirs: tuple[Path, Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The command line's ``atlas record`` (the embedded pair's atlases are recorded in-process on the
    suite's engine, ``tests/test_embedded.py``): its flags reach the pair and the run."""
    from talon.atlas.data import parse_atlas

    target, draft = pair_dirs
    out = tmp_path / "atlas.json"
    run_cli(["atlas", "record", "--prompt", "abc abc abc", "--target", str(target), "--draft", str(draft), "--device",
             "cpu", "--dtype", "float32", "--max-new-tokens", "6", "--cost-aware", "off", "--no-chat-template",
             "--out", str(out)], capsys)
    atlas = parse_atlas(json.loads(out.read_text()))
    assert atlas.models["dtype"] == "float32" and len(atlas.output) == 6 and atlas.children


def engine_builders(root: Path = REPO) -> set[str]:
    """Front-end files that build an engine or load a pair themselves, not through talon.engine.build."""
    found = set()
    paths = [p for entry in FRONT_END_PATHS for p in ((root / entry).rglob("*.py") if (root / entry).is_dir()
                                                 else [root / entry] if (root / entry).is_file() else [])]
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                    "Engine", "load_pair"):
                found.add(str(path.relative_to(root)))
    return found


def test_no_front_end_builds_its_engine_another_way(tmp_path: Path) -> None:
    assert engine_builders() == set()
    (tmp_path / "talon" / "cli").mkdir(parents=True)
    (tmp_path / "app.py").write_text("")
    (tmp_path / "talon" / "cli" / "rogue.py").write_text("from talon.engine.engine import Engine\n"
                                                         "engine = Engine(t, d)\n")
    assert engine_builders(tmp_path) == {"talon/cli/rogue.py"}


def test_every_switch_has_one_proven_default_per_device_kind() -> None:
    switches = {switch for switch, _ in PROVEN}
    assert switches == {"forward", "fold", "chain", "async_draft", "prepack"}
    for switch in switches - {"prepack"}:  # prepacking is a CPU layout: the host's check decides it
        for kind in ("cpu", "cuda"):
            assert proven_default(switch, kind).run, (switch, kind)
    assert proven_default("async_draft", "cuda").value == "off" and KNOB["async_draft"].default is False



def test_auto_resolves_to_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` reads the table, nothing else: change a row and the resolution follows."""
    import talon.settings
    from talon.graphs.static import resolve_forward
    from talon.models.attention import resolve_fold

    cpu = torch.device("cpu")
    assert resolve_forward("auto", cpu) == "dynamic" and resolve_fold(None, cpu)
    monkeypatch.setitem(talon.settings.PROVEN, ("forward", "cpu"), talon.settings.Proven("static", "a test"))
    monkeypatch.setitem(talon.settings.PROVEN, ("fold", "cpu"), talon.settings.Proven("off", "a test"))
    assert resolve_forward("auto", cpu) == "static" and not resolve_fold(None, cpu)


def proven_table() -> str:
    """docs/gpu.md's table of defaults, from ``talon.settings.PROVEN`` (so the two cannot drift)."""
    lines = ["| switch | CPU default | proved by | CUDA default | proved by |", "| --- | --- | --- | --- | --- |"]
    for switch in dict.fromkeys(s for s, _ in PROVEN):
        cpu, cuda = PROVEN[(switch, "cpu")], PROVEN.get((switch, "cuda"))
        lines.append(f"| `{switch}` | {cpu.value} | {cpu.run} | {cuda.value if cuda else 'n/a'} | "
                     f"{cuda.run if cuda else 'a CPU layout'} |")
    return "\n".join(lines)


def test_the_gpu_doc_states_every_default_and_its_proof() -> None:
    assert proven_table() in (REPO / "docs" / "gpu.md").read_text(encoding="utf-8")


def test_every_proven_row_is_what_the_code_reads_and_cites_files_that_exist() -> None:
    """The rows that ``auto`` does not resolve (chain, async drafting, prepacking) equal the
    defaults the code holds, and every run file a row cites is committed."""
    import re

    from talon.settings import Settings

    plain = Settings.from_env({})
    for kind in ("cpu", "cuda"):
        assert (proven_default("chain", kind).value == "on") == plain.chain, kind
        assert (proven_default("async_draft", kind).value == "on") == KNOB["async_draft"].default, kind
    assert (proven_default("prepack", "cpu").value == "auto") == (plain.prepack is None)
    cited = {path.rstrip(".,;:)") for row in PROVEN.values()
             for path in re.findall(r"(?:docs|tests|scripts|data)/[\w./-]+", row.run)}
    assert "docs/runs/2026-11-22-cpu-async.md" in cited, "the async default cites its measured run"
    assert {p for p in cited if not (REPO / p).exists()} == set()
