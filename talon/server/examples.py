"""The example prompts the app offers: the first turn of the first few questions of each bundled
Spec-Bench suite (``talon.specbench``), or, if that folder is missing, a few built-in prompts.
Nothing is read at import time."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from talon.specbench import SPECBENCH_DIR, SUITE_NAMES, SuiteError, read_prompt_texts

logger = logging.getLogger(__name__)

# the suites in the order the app lists them (code first: the embedded pair is a coder pair)
EXAMPLE_SUITES: tuple[str, ...] = ("humaneval", "sum", "mt_bench", "gsm8k", "alpaca", "qa")
PER_SUITE = 3
MAX_EXAMPLE_CHARS = 6000


@dataclass(frozen=True)
class Example:
    suite: str
    prompt: str

    @property
    def label(self) -> str:
        head = " ".join(self.prompt.split())
        return f"{self.suite}: {head[:70]}{'…' if len(head) > 70 else ''}"


BUILTIN_EXAMPLES: tuple[Example, ...] = (
    Example(
        "code",
        "Complete the code I provided.\n\ndef fibonacci(n: int) -> list[int]:\n"
        '    """Return the first n Fibonacci numbers.\n    >>> fibonacci(5)\n'
        '    [0, 1, 1, 2, 3]\n    """\n',
    ),
    Example(
        "copy",
        "Repeat this list exactly, then add two more items in the same style:\n"
        "- apples: 3 kg, green\n- pears: 2 kg, yellow\n- plums: 1 kg, purple\n",
    ),
    Example("math", "A train travels 60 km in 45 minutes. What is its average speed in km/h? Explain."),
    Example("chat", "Explain in three sentences why the sky is blue."),
)


def read_suite(path: Path, suite: str, limit: int) -> list[Example]:
    """The first ``limit`` prompts of one suite file short enough to show (bad lines skipped)."""
    texts = [t for t in read_prompt_texts(path, strict=False) if len(t) <= MAX_EXAMPLE_CHARS]
    return [Example(suite, text) for text in texts[:limit]]


def load_examples(directory: Path = SPECBENCH_DIR, per_suite: int = PER_SUITE) -> list[Example]:
    """SpecBench examples (``per_suite`` from each suite) or, without the folder, the built-ins."""
    examples: list[Example] = []
    for stem in EXAMPLE_SUITES:
        path = directory / f"{stem}.jsonl"
        if path.is_file():
            try:
                examples.extend(read_suite(path, SUITE_NAMES[stem], per_suite))
            except (OSError, SuiteError, UnicodeDecodeError) as error:
                logger.warning("cannot read %s: %s", path, error)
    return examples or list(BUILTIN_EXAMPLES)
