"""The docs name only code that exists: every ``talon.`` module, class, function or attribute and
every ``talon/`` path that a document mentions in backticks resolves in the code as it is."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re
from pathlib import Path

from tests.tiny import REPO

DOCS = (REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), REPO / "experiments" / "README.md")
DOTTED = re.compile(r"\btalon(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w./~-])talon/[\w/]*\w(?:\.py)?/?")  # not ~/.cache/talon/...


def importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def resolves(name: str) -> bool:
    """The longest importable prefix of ``name``, then each further part an attribute (a class's
    dataclass field or annotation counts)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        if importable(".".join(parts[:cut])):
            break
    else:
        return False
    obj = importlib.import_module(".".join(parts[:cut]))
    for part in parts[cut:]:
        if hasattr(obj, part):
            obj = getattr(obj, part)
        elif isinstance(obj, type) and (part in getattr(obj, "__annotations__", {})
                                        or dataclasses.is_dataclass(obj)
                                        and part in {f.name for f in dataclasses.fields(obj)}):
            return True  # an instance's field: nothing further to look up
        else:
            return False
    return True


def spans(text: str) -> list[str]:
    return re.findall(r"`+([^`]+)`+", text)


def missing_names(docs: tuple[Path, ...] = DOCS, root: Path = REPO) -> set[str]:
    found = set()
    for doc in docs:
        for span in spans(doc.read_text(encoding="utf-8")):
            for name in DOTTED.findall(span):
                name = name.rstrip(".")
                if not resolves(name):
                    found.add(f"{doc.relative_to(root)}: {name}")
            for path in PATH.findall(span):
                if not (REPO / path).exists():
                    found.add(f"{doc.relative_to(root)}: {path}")
    return found


def test_every_talon_name_in_the_docs_exists() -> None:
    assert missing_names() == set()


def test_a_stale_name_is_caught(tmp_path: Path) -> None:
    doc = tmp_path / "stale.md"
    doc.write_text("The loop is `talon.engine.run.Run._step`; the old one was `talon.decode.Run`,\n"
                   "costs came from `Engine.costs`, `talon.cost.model.CostModel.no_such_method()` and\n"
                   "`talon.tree.DraftTree.stop` is a field; see `talon/engine/run.py` and `talon/decode.py`.\n")
    assert missing_names((doc,), tmp_path) == {"stale.md: talon.decode.Run",
                                                "stale.md: talon.cost.model.CostModel.no_such_method",
                                                "stale.md: talon/decode.py"}


def test_every_experiment_says_what_it_answered_and_where_its_figures_are() -> None:
    """experiments/README.md has a row for each experiment: its question and a run file that exists."""
    rows = {}
    for line in (REPO / "experiments" / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells
    assert set(rows) == {p.stem for p in (REPO / "experiments").glob("*.py")}
    for name, (_, question, figures) in rows.items():
        link = re.search(r"\]\(\.\./(docs/runs/[^)]+)\)", figures)
        assert question.endswith("?") and link and (REPO / link.group(1)).exists(), name
