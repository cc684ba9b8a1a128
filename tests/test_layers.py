"""Imports run one way: down the layers of the map in ``docs/design.md`` (read from its table, so
the document and this test cannot drift apart). Deferred imports inside functions count too."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.tiny import REPO


def layers() -> dict[str, int]:
    """Top-level name under ``talon`` (module or package) -> its layer, from the design map."""
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    table = text[text.index("## The map, on one page"):text.index("**The step loop**")]
    found: dict[str, int] = {}
    for number, modules in re.findall(r"^\| (\d)\. [^|]+\| ([^|]+) \|", table, flags=re.M):
        for name in re.findall(r"`([\w./]+)`", modules):
            found[name.removeprefix("talon/").rstrip("/").removesuffix(".py")] = int(number)
    return found


def layer_of(module: str, table: dict[str, int]) -> int | None:
    parts = module.split(".")
    if parts[0] == "app":
        return table.get("app")
    return table.get(parts[1]) if parts[0] == "talon" and len(parts) > 1 else None


def is_module(name: str) -> bool:
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            if node.module == "talon" or node.module.startswith("talon."):  # a module imported by name
                names.update(name for alias in node.names if is_module(name := f"{node.module}.{alias.name}"))
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def upward_imports(table: dict[str, int], root: Path = REPO) -> set[tuple[str, str]]:
    found = set()
    for path in production_files(root):  # scripts/ sit outside the layers: layer_of gives None
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        own = layer_of(module, table)
        for name in imports(path):
            theirs = layer_of(name, table)
            if own is not None and theirs is not None and theirs > own:
                found.add((module, name))
    return found


def test_the_design_map_places_every_module() -> None:
    table = layers()
    assert {"settings", "models", "core", "engine", "atlas", "server", "ui", "app"} <= set(table)
    top = {p.stem if p.is_file() else p.name for p in (REPO / "talon").iterdir()
           if (p.suffix == ".py" or (p / "__init__.py").is_file()) and p.stem not in ("__init__", "__main__")}
    assert top <= set(table), f"place these in docs/design.md's map: {sorted(top - set(table))}"


MAX_ROOT_MODULES = 8


def root_modules(root: Path = REPO) -> list[str]:
    return sorted(p.name for p in (root / "talon").glob("*.py"))


def test_the_root_holds_a_handful_of_modules() -> None:
    """Everything else lives in a package that says its job (docs/design.md, the map)."""
    assert len(root_modules()) <= MAX_ROOT_MODULES, root_modules()


def test_no_import_runs_up_the_layers() -> None:
    assert upward_imports(layers()) == set()


def part_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "talon" and len(parts) > 1 else None


def mutual_imports(root: Path = REPO) -> set[tuple[str, str]]:
    """Pairs of top-level parts (``atlas`` and ``figures``, ``bench`` and ``cli``) that import
    each other, ``TYPE_CHECKING`` and deferred imports included: each pair is one part."""
    arrows = set()
    for path in production_files(root):
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        own = part_of(module)
        for name in imports(path):
            theirs = part_of(name)
            if own is not None and theirs is not None and theirs != own:
                arrows.add((own, theirs))
    return {(a, b) for a, b in arrows if (b, a) in arrows and a < b}


# one Decode press, in the order its call descends: its handler, the user
# action, the device call, the request's checks and run, the pair held, the engine's loop
REQUEST_WAY = ("talon.ui.decode_handlers", "talon.server.facade", "talon.server.device", "talon.server.request",
               "talon.server.pair", "talon.engine.build", "talon.engine.engine", "talon.engine.run")


def climbs(way: tuple[str, ...], root: Path = REPO) -> set[tuple[str, str]]:
    """(module, earlier module it imports) along ``way``: a call that would climb back."""
    found = set()
    for i, module in enumerate(way):
        path = root / (module.replace(".", "/") + ".py")
        names = imports(path)
        found.update((module, earlier) for earlier in way[:i] if earlier in names
                     or any(n.startswith(earlier + ".") for n in names))
    return found


def test_a_decode_request_descends_without_climbing_back() -> None:
    assert climbs(REQUEST_WAY) == set()
    assert climbs(("talon.server.pair", "talon.server.request")) == {("talon.server.request", "talon.server.pair")}
    assert climbs(("talon.server.pair", "talon.server.device")) == {("talon.server.device", "talon.server.pair")}


def test_no_two_parts_import_each_other() -> None:
    assert mutual_imports() == set()


def test_an_upward_import_is_caught(tmp_path: Path) -> None:
    shutil.copytree(REPO / "talon", tmp_path / "talon", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "app.py", tmp_path / "app.py")
    with (tmp_path / "talon" / "settings.py").open("a", encoding="utf-8") as fh:
        fh.write("\n\ndef engine():\n    from talon.engine.engine import Engine\n    return Engine\n")
    assert upward_imports(layers(), tmp_path) == {("talon.settings", "talon.engine.engine")}
    (tmp_path / "talon" / "extra.py").write_text('"""one module too many at the root"""\n')
    assert len(root_modules(tmp_path)) == len(root_modules()) + 1
    with (tmp_path / "talon" / "figures" / "atlas.py").open("a", encoding="utf-8") as fh:
        fh.write("\n\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from talon.atlas import data\n")
    with (tmp_path / "talon" / "atlas" / "sweep.py").open("a", encoding="utf-8") as fh:
        fh.write("\n\ndef chart():\n    from talon.figures import atlas\n    return atlas\n")
    # the planted settings -> engine too
    assert mutual_imports(tmp_path) == {("atlas", "figures"), ("engine", "settings")}


# ---------------------------------------------------------------------------------------------
# Module size and private names: the repository's own terms
# ---------------------------------------------------------------------------------------------

MAX_LINES = 450


def production_files(root: Path = REPO) -> list[Path]:
    return [*sorted((root / "talon").rglob("*.py")), root / "app.py", *sorted((root / "scripts").glob("*.py")),
            *sorted((root / "experiments").glob("*.py"))]


def long_modules(root: Path = REPO) -> dict[str, int]:
    sizes = {str(p.relative_to(root)): len(p.read_text(encoding="utf-8").splitlines()) for p in production_files(root)}
    return {name: lines for name, lines in sizes.items() if lines > MAX_LINES}


# torch's packed-weight kernels have no public name: the one place that calls them (a packed
# target, talon/models/quant.py) names them here, and nothing else may reach into a library
TORCH_KERNELS = {"torch._int_mm", "torch.ops.aten._weight_int4pack_mm_for_cpu", "torch.ops.aten._weight_int8pack_mm",
                 "torch.ops.aten._convert_weight_to_int4pack_for_cpu"}
# nor has dynamo's recompile limit, which the compiled step raises (talon/graphs/static.py: compiled_decoder)
# nor has the attention implementation a model runs, which talon/models/attention.py reads before switching it
# oneDNN's linear on a weight reordered once has no public name either (talon/models/prepack.py)
ONEDNN_KERNELS = {"torch.ops.mkldnn._reorder_linear_weight", "torch.ops.mkldnn._linear_pointwise"}
LIBRARY_INTERNALS = {"quant.py": TORCH_KERNELS, "prepack.py": ONEDNN_KERNELS, "static.py": {"torch._dynamo"},
                     "attention.py": {"model.config._attn_implementation"}}


def private_crossings(root: Path = REPO) -> set[str]:
    """``from m import _name`` and ``something._name`` (but ``self._name``, ``cls._name``, ``super()._name``):
    a module reaching into another's private names, or into a library's internals."""
    found = set()
    for path in production_files(root):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                found.update(f"{path.relative_to(root)}: import {a.name}" for a in node.names if is_private(a.name))
            elif isinstance(node, ast.Attribute) and is_private(node.attr):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                if ast.unparse(node.value) == "super()":  # the class's own base, in its own module
                    continue
                if ast.unparse(node) not in LIBRARY_INTERNALS.get(path.name, set()):
                    found.add(f"{path.relative_to(root)}: {ast.unparse(node)}")
    return found


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_is_over_450_lines() -> None:
    assert long_modules() == {}


def test_no_private_name_crosses_a_module() -> None:
    assert private_crossings() == set()


def test_a_long_module_and_a_private_crossing_are_caught(tmp_path: Path) -> None:
    shutil.copytree(REPO / "talon", tmp_path / "talon", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "scripts", tmp_path / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "app.py", tmp_path / "app.py")
    with (tmp_path / "talon" / "atlas" / "serving.py").open("a", encoding="utf-8") as fh:
        fh.write("\n" * MAX_LINES)
    with (tmp_path / "app.py").open("a", encoding="utf-8") as fh:
        fh.write("\nfrom talon.settings import _get\n\n\ndef subparsers(p):\n    return p._subparsers\n")
    assert set(long_modules(tmp_path)) == {"talon/atlas/serving.py"}
    assert private_crossings(tmp_path) == {"app.py: import _get", "app.py: p._subparsers"}


# ---------------------------------------------------------------------------------------------
# The views reach the server through its facade, and no file finds its imports by editing sys.path
# ---------------------------------------------------------------------------------------------

# what a view may not import: torch, the models, the algorithm, the step, the engine, and any of
# the server but its facade
BELOW_THE_FACADE = ("torch", "talon.models", "talon.core", "talon.cost", "talon.graphs", "talon.drafters",
                    "talon.engine", "talon.server")
FACADE = "talon.server.facade"


def view_reaches(root: Path = REPO) -> set[tuple[str, str]]:
    """(view module, what it imports past the facade), deferred and TYPE_CHECKING imports included."""
    found = set()
    for path in sorted((root / "talon" / "ui").rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for name in imports(path):
            if name != FACADE and any(name == b or name.startswith(b + ".") for b in BELOW_THE_FACADE):
                found.add((module, name))
    return found


def path_edits(root: Path = REPO) -> set[str]:
    """Files that change ``sys.path`` to find their imports (run them as modules instead)."""
    found = set()
    for path in production_files(root):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and ast.unparse(node) in ("sys.path.insert", "sys.path.append"):
                found.add(str(path.relative_to(root)))
    return found


def test_the_views_import_only_the_server_facade() -> None:
    assert view_reaches() == set()


def test_no_file_edits_sys_path() -> None:
    assert path_edits() == set()


def test_a_view_past_the_facade_and_a_path_edit_are_caught(tmp_path: Path) -> None:
    for folder in ("talon", "scripts", "experiments"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "app.py", tmp_path / "app.py")
    with (tmp_path / "talon" / "ui" / "stream.py").open("a", encoding="utf-8") as fh:
        fh.write("\n\ndef device():\n    import torch\n    from talon.engine.run import Run\n"
                 "    from talon.server.pair import SLOT\n    return torch, Run, SLOT\n")
    assert view_reaches(tmp_path) == {("talon.ui.stream", "torch"), ("talon.ui.stream", "talon.engine.run"),
                                      ("talon.ui.stream", "talon.server.pair")}
    with (tmp_path / "scripts" / "report.py").open("a", encoding="utf-8") as fh:
        fh.write("\n\nimport sys\nsys.path.insert(0, '.')\n")
    assert path_edits(tmp_path) == {"scripts/report.py"}


# ---------------------------------------------------------------------------------------------
# Importing the views loads no torch: what runs a model is imported by the call that runs it
# ---------------------------------------------------------------------------------------------

LOADED_TORCH = ("loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
                "print('torch loaded' if loaded else 'no torch')\n")
NO_TORCH = "import sys, talon.ui\n" + LOADED_TORCH
# the command line's model-free commands, run in one interpreter: none of them imports torch
MODEL_FREE_COMMANDS = ("import contextlib, io, sys\n"
                       "from talon.cli.main import main\n"
                       "with contextlib.redirect_stdout(io.StringIO()):\n"
                       "    for argv in (['costs', '--show'],\n"
                       "                 ['atlas', 'sweep', 'data/llamacpp_check/atlases', '--engine', 'llamacpp',\n"
                       "                  '--grid', 'type=draft-simple', '--grid', 'n_max=4', '--json']):\n"
                       "        assert main(argv) == 0, argv\n" + LOADED_TORCH)


# the interpreter stops at the first import of torch: the answer is known, and importing torch and
# transformers on a busy host took half a minute
STOP_AT_TORCH = ("import os, sys\n"
                 "class StopAtTorch:\n"
                 "    def find_spec(self, name, path=None, target=None):\n"
                 "        if name == 'torch':\n"
                 "            print('torch loaded', flush=True)\n"
                 "            os._exit(0)\n"
                 "sys.meta_path.insert(0, StopAtTorch())\n")


def loads_torch(code: str, root: Path = REPO, env: dict[str, str] | None = None) -> bool:
    """Does ``code``, in a fresh interpreter over ``root``, import torch?"""
    out = subprocess.run([sys.executable, "-c", STOP_AT_TORCH + code], cwd=root, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(root), **(env or {})})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().endswith("torch loaded")


def ui_import_loads_torch(root: Path = REPO) -> bool:
    """Does ``import talon.ui`` load torch?"""
    return loads_torch(NO_TORCH, root)


def test_importing_the_ui_loads_no_torch() -> None:
    assert not ui_import_loads_torch()


def test_the_model_free_commands_load_no_torch(tmp_path: Path) -> None:
    """``costs --show`` and a serving engine's sweep answer in a second, not the six that importing
    torch and transformers takes; ``generate`` loads them (and a replay, which runs the drafters).
    ``loads_torch`` catches a planted import (``test_a_view_that_loads_torch_is_caught``); this
    test failed while ``cli/args.py`` imported ``PairKey`` from ``talon.engine.build``."""
    assert not loads_torch(MODEL_FREE_COMMANDS, env={"TALON_COST_CACHE": str(tmp_path)})


def test_a_view_that_loads_torch_is_caught(tmp_path: Path) -> None:
    shutil.copytree(REPO / "talon", tmp_path / "talon")  # byte code too: valid, as copied with its sources' times
    with (tmp_path / "talon" / "lessons" / "hybrid.py").open("a", encoding="utf-8") as fh:
        fh.write("\n\nfrom talon.drafters.model import ModelSource  # a lesson that drafts for real\n")
    assert ui_import_loads_torch(tmp_path)
