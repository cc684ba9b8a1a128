"""What the UI offers before a run: example prompts (SpecBench suites) and model presets.

Example prompts come from the repository's bundled Spec-Bench prompts, ``data/specbench/*.jsonl``
(the first turn of the first few questions of each suite); if that folder is missing, from a few
built-in prompts. Nothing is read at import time.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
SPECBENCH_DIR = REPO_ROOT / "data" / "specbench"

# file stem -> suite name shown in the UI, in the order the UI lists them
SUITES: dict[str, str] = {
    "humaneval": "HumanEval",
    "sum": "CNN/DM",
    "mt_bench": "MT-Bench",
    "gsm8k": "GSM8K",
    "alpaca": "Alpaca",
    "qa": "Natural Questions",
}
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
    """The first turn of the first ``limit`` questions of one suite file (bad lines skipped)."""
    examples: list[Example] = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if len(examples) >= limit:
                break
            try:
                turns = json.loads(line).get("turns") or []
            except (json.JSONDecodeError, AttributeError):
                continue
            if turns and isinstance(turns[0], str) and 0 < len(turns[0]) <= MAX_EXAMPLE_CHARS:
                examples.append(Example(suite, turns[0]))
    return examples


def load_examples(directory: Path = SPECBENCH_DIR, per_suite: int = PER_SUITE) -> list[Example]:
    """SpecBench examples (``per_suite`` from each suite) or, without the folder, the built-ins."""
    examples: list[Example] = []
    for stem, suite in SUITES.items():
        path = directory / f"{stem}.jsonl"
        if path.is_file():
            try:
                examples.extend(read_suite(path, suite, per_suite))
            except OSError as error:
                log.warning("cannot read %s: %s", path, error)
    return examples or list(BUILTIN_EXAMPLES)


@dataclass(frozen=True)
class ModelPreset:
    """A target/draft pair the UI offers. ``None`` models mean: the ones from Settings.

    ``dtype`` is the weights dtype unless TALON_DTYPE names one; ``preload`` marks the pairs whose
    weights the Space bakes into its image at build time (README ``preload_from_hub``)."""

    key: str
    label: str
    target: str | None = None
    draft: str | None = None
    needs_cuda: bool = False
    dtype: str | None = None
    preload: bool = False
    draft_quant: str | None = None  # None: TALON_DRAFT_QUANT
    gpu_gib: float | None = None  # the GPU memory the pair is meant for (the memory guard names it)

    @property
    def repos(self) -> tuple[str, ...]:
        return tuple(name for name in (self.target, self.draft) if name is not None)


DEFAULT_PRESET = "default"
# The pair a CUDA machine selects and loads at start, unless TALON_TARGET/TALON_DRAFT name models.
STARTUP_GPU_PRESET = "qwen2.5-7b"
PRESETS: tuple[ModelPreset, ...] = (
    ModelPreset(DEFAULT_PRESET, "Default pair (TALON_TARGET + TALON_DRAFT)"),
    ModelPreset(
        "qwen2.5-7b",
        "Qwen2.5-7B-Instruct + Qwen2.5-0.5B-Instruct (GPU, bf16)",
        "Qwen/Qwen2.5-7B-Instruct",
        "Qwen/Qwen2.5-0.5B-Instruct",
        needs_cuda=True,
        dtype="bfloat16",
        preload=True,
        gpu_gib=24,
    ),
    ModelPreset(
        "qwen2.5-coder-7b",
        "Qwen2.5-Coder-7B-Instruct + Qwen2.5-Coder-0.5B-Instruct (GPU, bf16)",
        "Qwen/Qwen2.5-Coder-7B-Instruct",
        "Qwen/Qwen2.5-Coder-0.5B-Instruct",
        needs_cuda=True,
        dtype="bfloat16",
        preload=True,
        gpu_gib=24,
    ),
    ModelPreset(
        "llama-3.1-8b",
        "Llama-3.1-8B-Instruct + Llama-3.2-1B-Instruct (GPU, bf16; gated: needs HF_TOKEN with access)",
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Llama-3.2-1B-Instruct",
        needs_cuda=True,
        dtype="bfloat16",
        gpu_gib=24,
    ),
    ModelPreset(
        "qwen2.5-14b",
        "Qwen2.5-14B-Instruct + Qwen2.5-0.5B-Instruct (GPU with 40 GB or more, bf16)",
        "Qwen/Qwen2.5-14B-Instruct",
        "Qwen/Qwen2.5-0.5B-Instruct",
        needs_cuda=True,
        dtype="bfloat16",
        gpu_gib=40,
    ),
)


def available_presets(cuda: bool) -> list[ModelPreset]:
    """The presets this machine can run: the larger pairs only with a CUDA GPU."""
    return [p for p in PRESETS if cuda or not p.needs_cuda]


def startup_preset(cuda: bool, models_configured: bool) -> str:
    """The preset selected and loaded at start: the GPU pair ``STARTUP_GPU_PRESET`` on a CUDA
    machine whose TALON_TARGET/TALON_DRAFT were left at their defaults, else the default pair."""
    return STARTUP_GPU_PRESET if cuda and not models_configured else DEFAULT_PRESET


def preload_repos() -> list[str]:
    """Hub repos the Space downloads at build time: those of the presets marked ``preload``."""
    return sorted({repo for p in PRESETS if p.preload for repo in p.repos})
