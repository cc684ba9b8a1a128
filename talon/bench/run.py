"""The run loop: every method on every prompt, interleaved, with the environment recorded and
every output checked by the judge."""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from talon.bench.config import BenchConfig
from talon.bench.data import Prompt
from talon.bench.env import BenchEnv
from talon.bench.judge import Divergence, TieJudge, default_tie_tol
from talon.bench.report import write_report
from talon.bench.results import BenchReport, Sample, aggregate
from talon.bench.runners import Runner, build_runners
from talon.decode import Engine, encode_prompt
from talon.models import LoadedModel

log = logging.getLogger("talon.bench")


def run_bench(
    target: LoadedModel,
    draft: LoadedModel | None,
    prompts: Sequence[Prompt],
    cfg: BenchConfig,
    out: Path | None = None,
    command: str = "",
    progress: bool = False,
    cache_dir: Path | None = None,
) -> BenchReport:
    """Run every method on every prompt (interleaved), check losslessness, aggregate; write the
    report to ``out`` when given. Never raises for a mismatch: see ``BenchReport.fatal``."""
    engine = Engine(target, draft, cache_dir=cache_dir)
    runners = build_runners(engine, cfg)
    if "hf-assisted" in cfg.methods and importlib.util.find_spec("sklearn") is None:
        log.warning("scikit-learn is not installed: hf-assisted keeps a fixed confidence threshold "
                    "(weaker than transformers' adaptive default); pip install scikit-learn")
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
