"""The run loop: every method on every prompt, interleaved, with the environment recorded and
every output checked by the judge."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from tqdm import tqdm

from talon.atlas.record import record_atlas
from talon.bench.env import BenchEnv
from talon.bench.judge import OutputCheck, TieJudge, default_tie_tol, first_divergence
from talon.bench.llamacpp import llamacpp_runners
from talon.bench.options import BenchConfig
from talon.bench.report import write_report
from talon.bench.results import BenchReport, Sample, aggregate
from talon.bench.runners import Runner, build_runners
from talon.engine.engine import Engine
from talon.engine.prompt import encode_prompt, eos_ids
from talon.models.head import head_rows
from talon.run_config import RunConfig
from talon.specbench import Prompt

logger = logging.getLogger("talon.bench")


def run_bench(
    engine: Engine,
    prompts: Sequence[Prompt],
    cfg: BenchConfig,
    out: Path | None = None,
    command: str = "",
    progress: bool = False,
) -> BenchReport:
    """Run every method on every prompt (interleaved) on ``engine``'s pair (``talon.engine.build``
    builds it as every front end does), check losslessness, aggregate; write the report to
    ``out`` when given. Never raises for a mismatch: see ``BenchReport.fatal``."""
    target, draft = engine.target, engine.draft
    runners: list[Runner] = [*build_runners(engine, cfg), *llamacpp_runners(
        cfg.methods, engine.target.name, engine.draft.name if engine.draft is not None else None)]
    if "hf-assisted" in cfg.methods and importlib.util.find_spec("sklearn") is None:
        logger.warning("scikit-learn is not installed: hf-assisted keeps a fixed confidence threshold "
                       "(weaker than transformers' adaptive default); pip install scikit-learn")
    vocab = head_rows(target.model)
    encoded = [encode_prompt(target.tokenizer, p.text, True, vocab) for p in prompts]
    warm_up_runners(runners, min(encoded, key=len), cfg.warmup_tokens)
    judge = TieJudge(target, cfg.tie_tol if cfg.tie_tol is not None else default_tie_tol(target.dtype))
    samples: list[Sample] = []
    checks: list[OutputCheck] = []
    eos = eos_ids(target)
    total = len(prompts) * len(runners)
    with tqdm(total=total, desc="bench", unit="run", file=sys.stderr, disable=not progress) as bar:
        for number, (prompt, ids) in enumerate(zip(prompts, encoded)):
            ran = run_prompt(runners, prompt, ids, cfg.max_new_tokens, number, bar)
            samples += ran
            checks += check_outputs(judge, ids, ran, cfg.max_new_tokens, eos)
    judge.release()
    if cfg.atlas and out is not None:
        record_atlases(engine, prompts, cfg, out / "atlases", progress)
    rows = aggregate(samples, checks, runners, verify_curve(engine, runners))
    costs = {f"draft_vocab={v}": c.to_dict() for v, c in engine.cost_snapshots().items()}
    env = BenchEnv.capture(target, draft, command, engine.forward_path)
    report = BenchReport(env, cfg, rows, checks, samples, costs, judge.precision)
    if out is not None:
        write_report(report, out)
    return report


def record_atlases(engine: Engine, prompts: Sequence[Prompt], cfg: BenchConfig, folder: Path, progress: bool) -> None:
    """A draft atlas of every prompt, recorded with the talon method's configuration."""
    folder.mkdir(parents=True, exist_ok=True)
    base = RunConfig(max_new_tokens=cfg.max_new_tokens)
    for prompt in tqdm(prompts, desc="atlas", unit="prompt", file=sys.stderr, disable=not progress):
        atlas = record_atlas(engine, prompt.text, base, suite=prompt.suite)
        (folder / f"{prompt.suite}-{prompt.index}.json").write_text(json.dumps(atlas.to_dict()), encoding="utf-8")
        logger.info("atlas %s-%d: run %.1f s + atlas %.1f s (%.2fx the run)", prompt.suite, prompt.index,
                    atlas.record["run_s"], atlas.record["atlas_s"], atlas.record["ratio"])


def verify_curve(engine: Engine, runners: Sequence[Runner]) -> Callable[[int], float] | None:
    """The verify curve the Talon runs planned on (the default draft vocabulary's snapshot, else
    any), for the free-drafting bound; read (cache or probe) if no Talon run needed one. None
    when no method ran on the Talon engine."""
    if not any(r.spec.engine == "talon" and r.spec.name != "ar" for r in runners):
        return None
    snapshots = engine.cost_snapshots()
    default_vocab = RunConfig().draft_vocab
    costs = snapshots.get(default_vocab) or next(iter(snapshots.values()), None)
    if costs is None:
        costs = engine.cost_snapshot(default_vocab)
    return costs.verify_s


def warm_up_runners(runners: Sequence[Runner], prompt_ids: list[int], tokens: int) -> None:
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


def check_outputs(
    judge: TieJudge, prompt_ids: list[int], samples: Sequence[Sample], max_new_tokens: int, eos: set[int]
) -> list[OutputCheck]:
    """Check every token of every sample of one prompt; log each near-tie and mismatch."""
    ar = next(s for s in samples if s.spec.name == "ar").outcome.token_ids
    checks = []
    for s in samples:
        ids = s.outcome.token_ids
        check = judge.check(prompt_ids, ids, max_new_tokens, eos)
        checks.append(OutputCheck(s.prompt.suite, s.prompt.index, s.spec.name, s.spec.engine, check,
                                  first_divergence(ar, ids)))
        where = f"{s.spec.name} on {s.prompt.suite}#{s.prompt.index}"
        if check.first_mismatch is not None:
            level = logging.ERROR if s.spec.engine == "talon" else logging.WARNING
            logger.log(level, "%s: real mismatch %s", where, check.first_mismatch)
        elif check.near_ties:
            logger.info("%s: %d near-tie position(s) %s, every other token the target's argmax",
                        where, len(check.near_ties), check.near_ties[:8])
    return checks
