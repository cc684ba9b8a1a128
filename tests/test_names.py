"""One name, one definition; one word, one meaning; no import cycle.

* Every public module-level name of ``talon/`` is defined in one module (``logger`` and an entry
  point's ``main`` aside); the others import it.
* The names retired because they meant two things (docs/design.md, "Words") stay retired.
* No module of ``talon/`` reaches itself through its imports, ``TYPE_CHECKING`` and deferred
  imports included.
"""

from __future__ import annotations

import ast
import re
import shutil
from collections import defaultdict
from pathlib import Path

import networkx as nx

from tests.tiny import REPO

ALLOWED_TWICE = {"logger", "main", "__all__"}


def module_name(path: Path, root: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def public_definitions(root: Path = REPO, folder: str = "talon") -> dict[str, list[str]]:
    """Public name -> the modules of ``folder`` that define it at module level (a def, a class,
    an assignment; an import is not a definition). In ``tests/`` the tests themselves and pytest's
    hooks are not names anyone shares."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted((root / folder).rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names: list[str] = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    elts = target.elts if isinstance(target, ast.Tuple) else [target]
                    names += [e.id for e in elts if isinstance(e, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            for name in names:
                if name.startswith("_") or name in ALLOWED_TWICE or name.startswith(NOT_SHARED.get(folder, ())):
                    continue
                found[name].append(module_name(path, root))
    return found


NOT_SHARED = {"tests": ("test_", "pytest_", "pytestmark")}


def defined_twice(root: Path = REPO, folder: str = "talon") -> dict[str, list[str]]:
    return {name: modules for name, modules in public_definitions(root, folder).items() if len(modules) > 1}


def test_every_public_name_is_defined_once() -> None:
    assert defined_twice() == {}


def test_every_name_the_tests_share_is_defined_once() -> None:
    """A constant, helper or fixture of ``tests/`` has one home (conftest.py, tiny.py, steps.py,
    browser.py, or the one test module that uses it); the tests themselves may repeat a name."""
    assert defined_twice(folder="tests") == {}


def cross_imports(root: Path = REPO) -> set[str]:
    """Test modules that import another test module (at any depth: deferred imports too)."""
    found = set()
    for path in sorted((root / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(re.fullmatch(r"tests\.test_\w+", n) for n in names):
                found.add(path.name)
    return found


def test_no_test_module_imports_another() -> None:
    assert cross_imports() == set()


def test_a_cross_import_and_a_second_test_definition_are_caught(tmp_path: Path) -> None:
    shutil.copytree(REPO / "tests", tmp_path / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / "tests" / "test_tree.py").open("a", encoding="utf-8") as fh:
        fh.write("\n\ndef later():\n    from tests.test_engine import PROMPTS\n    return PROMPTS\n")
    with (tmp_path / "tests" / "test_retrieval.py").open("a", encoding="utf-8") as fh:
        fh.write("\n\nPROMPTS = ['one more list of prompts']\n")
    assert cross_imports(tmp_path) == {"test_tree.py"}
    assert defined_twice(tmp_path, "tests") == {"PROMPTS": ["tests.test_retrieval", "tests.tiny"]}


def test_a_second_definition_is_caught(tmp_path: Path) -> None:
    shutil.copytree(REPO / "talon", tmp_path / "talon", ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / "talon" / "lessons" / "hybrid.py").open("a", encoding="utf-8") as fh:
        fh.write('\n\nDRAFTERS = ("model", "retrieval", "hybrid")\n')
    assert defined_twice(tmp_path) == {"DRAFTERS": ["talon.knobs", "talon.lessons.hybrid"]}


# ---------------------------------------------------------------------------------------------
# Retired words: each meant two things (docs/design.md, "Words", says what replaced it)
# ---------------------------------------------------------------------------------------------

RETIRED = {
    r"\bHybridDrafter\b": "TreeDrafter (one class serves every drafter kind, not only hybrid)",
    r"\btalon[./]step\b(?!s)": "talon.graphs (a step is one iteration of the loop)",
    r"\btalon[./]engine[./](decode|steps)\b": "talon.engine.engine / run / forwards",
    r"\bStepForwards\b|\bresolve_step\b": "Forwards, resolve_forward (the option picks how forwards run)",
    r"\btalon[./]atlas[./]engine(s|_sweep|_costs)\b": "talon.atlas.serving_* (vLLM and SGLang are serving engines)",
    r"\bEngine(Policy|Run|Row|Costs|Draft|Step|Kind)\b": "Serving* (a serving engine's), RunnerKind",
    r"\bdrafters\.SOURCES\b|from talon\.drafters import SOURCES\b":
        "talon.drafters.SOURCE_MAKERS (tree.SOURCES: node origins)",
    r"\b(Model|Head|StaticModel|Retrieval)Drafter\b": "ModelSource, HeadSource, StaticModelSource, Retriever "
                                                     "(a source is a drafter's half, not a drafter)",
    r"\bmodel_drafter\b": "model_source",
    r"\b[Ss]tatic steps?\b": "static forward (a step is one iteration of the loop)",
}

# Names a field, parameter or attribute may no longer carry: (class or "*", name) -> what replaced it.
RETIRED_MEMBERS = {
    ("TreeDrafter", "model"): "TreeDrafter.source (a draft source)",
    ("TreeDrafter", "retrieval"): "TreeDrafter.retriever",
    ("PreDraft", "drafter"): "PreDraft.source (it holds a fork of the source)",
    ("Engine", "path"): "Engine.forward_path",
    ("RunModels", "forward"): "RunModels.forward_path",
    ("RunSummary", "forward"): "RunSummary.forward_path",
}
# (name, annotation pattern) a field or parameter may not pair: the name says one thing, the type another
RETIRED_ANNOTATED = {
    (r"drafter|model", r"\b\w*Source\b"): "a draft source is named source",
    (r"source", r"PreTrainedModel|Module|LoadedModel"): "a model is not a source",
    (r"engine", r"^(str|Serving|Literal\[.*)$"): "a serving engine's name is serving (an engine is Talon's Engine)",
}


def _annotated(tree: ast.AST) -> list[tuple[str, str, str, int]]:
    """(class or "*", name, annotation text, line) of every annotated parameter and field, and the
    attributes a method sets on ``self`` (annotation "")."""
    found: list[tuple[str, str, str, int]] = []

    def visit(node: ast.AST, owner: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, child.name)
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = child.args
                for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                    note = ast.unparse(arg.annotation) if arg.annotation else ""
                    found.append(("*", arg.arg, note, arg.lineno))
                if owner != "*":
                    found.append((owner, child.name, "", child.lineno))
                    for sub in ast.walk(child):
                        targets = sub.targets if isinstance(sub, ast.Assign) else (
                            [sub.target] if isinstance(sub, ast.AnnAssign) else [])
                        for t in targets:
                            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                                found.append((owner, t.attr, "", sub.lineno))
                visit(child, "*")
                continue
            if isinstance(child, ast.AnnAssign) and isinstance(child.target, ast.Name):
                found.append((owner, child.target.id, ast.unparse(child.annotation), child.lineno))
            visit(child, owner)

    visit(tree, "*")
    return found


def retired_members(root: Path = REPO) -> set[str]:
    """Retired field, parameter and attribute names in ``talon/`` (RETIRED_MEMBERS, RETIRED_ANNOTATED)."""
    found = set()
    for path in sorted((root / "talon").rglob("*.py")):
        where = path.relative_to(root)
        for owner, name, note, line in _annotated(ast.parse(path.read_text(encoding="utf-8"))):
            if (owner, name) in RETIRED_MEMBERS:
                found.add(f"{where}:{line}: {owner}.{name}")
            for (names, types), _why in RETIRED_ANNOTATED.items():
                if note and re.fullmatch(names, name) and re.search(types, note):
                    found.add(f"{where}:{line}: {name}: {note}")
    return found


def retired_uses(root: Path = REPO) -> set[str]:
    files = [*sorted((root / "talon").rglob("*.py")), *sorted((root / "tests").glob("*.py")),
             *sorted((root / "scripts").glob("*.py")), *sorted((root / "experiments").glob("*.py"))]
    docs = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    found = set()
    for path in [p for p in files + docs if p.is_file() and p.name != "test_names.py"]:
        text = path.read_text(encoding="utf-8")
        for pattern in RETIRED:
            if re.search(pattern, text):
                found.add(f"{path.relative_to(root)}: {pattern}")
    return found


def test_retired_words_stay_retired() -> None:
    assert retired_uses() == set()


def test_retired_fields_and_parameters_stay_retired() -> None:
    assert retired_members() == set()


def test_a_retired_field_or_parameter_is_caught(tmp_path: Path) -> None:
    shutil.copytree(REPO / "talon", tmp_path / "talon", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "talon" / "drafters" / "rogue.py").write_text(
        "from talon.core.contracts import DraftSource\n\n\n"
        "class TreeDrafter:\n"
        "    def __init__(self, drafter: DraftSource, engine: str) -> None:\n"
        "        self.model = drafter\n")
    assert retired_members(tmp_path) == {
        "talon/drafters/rogue.py:5: drafter: DraftSource", "talon/drafters/rogue.py:5: engine: str",
        "talon/drafters/rogue.py:6: TreeDrafter.model",
    }


def test_a_retired_word_is_caught(tmp_path: Path) -> None:
    for folder in ("talon", "tests", "scripts", "experiments", "docs"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__", "runs"))
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    (tmp_path / "talon" / "drafters" / "rogue.py").write_text("from talon.drafters.tree_drafter import TreeDrafter\n"
                                                               "HybridDrafter = TreeDrafter\n")
    assert retired_uses(tmp_path) == {r"talon/drafters/rogue.py: \bHybridDrafter\b"}


def test_the_design_doc_says_the_vocabulary_first() -> None:
    """The words table is on design.md's first screen, and names every word this test guards."""
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    words = text.index("## Words")
    assert words < text.index("## The map, on one page")
    table = text[words:text.index("## The map, on one page")]
    for word in ("step", "forward", "engine", "serving engine", "drafter", "drafter kind", "draft source",
                 "retriever", "forward path",
                 "node source", "KV cut"):
        assert f"| {word} |" in table, word


# ---------------------------------------------------------------------------------------------
# No import cycle
# ---------------------------------------------------------------------------------------------


def import_graph(root: Path = REPO) -> nx.DiGraph:
    """talon module -> talon modules it imports (``from a import b`` counts ``a.b`` where that is a
    module), at any depth of the file: deferred and ``TYPE_CHECKING`` imports included."""
    modules = {module_name(p, root): p for p in sorted((root / "talon").rglob("*.py"))}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            graph.add_edges_from((module, name) for name in names if name in modules and name != module)
    return graph


def import_cycles(root: Path = REPO) -> list[list[str]]:
    return [sorted(c) for c in nx.simple_cycles(import_graph(root))]


def test_no_import_cycle() -> None:
    assert import_cycles() == []


def test_an_import_cycle_is_caught(tmp_path: Path) -> None:
    shutil.copytree(REPO / "talon", tmp_path / "talon", ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / "talon" / "drafters" / "model.py").open("a", encoding="utf-8") as fh:
        fh.write("\n\nif TYPE_CHECKING:\n    from talon.drafters.layer_skip import layer_skip_source\n")
    assert import_cycles(tmp_path) == [["talon.drafters.layer_skip", "talon.drafters.model"]]
