"""The command line of ``python -m talon.bench``."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

from tqdm.contrib.logging import logging_redirect_tqdm

from talon.bench.loop import run_bench
from talon.bench.options import (
    DEFAULT_LIMIT,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_METHODS,
    METHODS,
    SWEEP_METHODS,
    BenchConfig,
    SweepConfig,
)
from talon.bench.peers import peer_section, read_peer_rows
from talon.bench.report import speed_table
from talon.bench.runners import talon_variant
from talon.cli.args import add_knob, add_model_args, csv, csv_of, pair_from_args
from talon.engine.build import build_engine
from talon.knobs import KNOB
from talon.models import ModelLoadError
from talon.run_config import RunConfig
from talon.settings import Settings
from talon.specbench import ALL_SUITES, SPECBENCH_SUITES, default_data_dir, load_prompts

logger = logging.getLogger("talon.bench")


def bench_parser(settings: Settings) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m talon.bench", description="Benchmark Talon against ar and HF")
    p.add_argument("--data", type=Path, default=default_data_dir(),
                   help="Spec-Bench prompt dir (default: %(default)s)")
    p.add_argument("--suites", type=csv, default=SPECBENCH_SUITES, help=f"comma list of {', '.join(ALL_SUITES)}")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                   help="prompts per suite, 0 = all (default: %(default)s, which with every method "
                   "and all six suites finishes in under an hour on a 2-core CPU)")
    p.add_argument("--start", type=int, default=0,
                   help="skip this many prompts of each suite first, e.g. to sweep defaults on prompts "
                   "the reported benchmark does not use (default: 0)")
    add_knob(p, KNOB["max_new_tokens"], DEFAULT_MAX_NEW_TOKENS, "new tokens per prompt")
    add_model_args(p, settings)
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="output dir (default: %(default)s)")
    p.add_argument("--methods", type=csv, default=None,
                   help=f"comma list of {', '.join(METHODS)} (default: all but the llamacpp ones, which need "
                   "scripts/llamacpp_build.sh; with --sweep: ar)")
    p.add_argument("--hf-assistant-tokens", type=csv, default=BenchConfig.hf_assistant_tokens,
                   help="hf-assisted variants: integers (fixed draft length), default, heuristic "
                   "(default: 4,8,default)")
    p.add_argument("--pld-tokens", type=int, default=BenchConfig.pld_tokens,
                   help="hf-pld prompt_lookup_num_tokens (default: %(default)s)")
    p.add_argument("--pld-ngrams", type=csv_of(int), default=BenchConfig.pld_ngrams,
                   help="hf-pld variants, each a max_matching_ngram_size; the fastest per suite is "
                   "reported (default: 2,3)")
    p.add_argument("--talon-async", choices=["auto", "on", "off"], default="auto",
                   help="async drafting for the talon method; auto = the knob table's default (off: "
                   "it measured slower on a CPU and no faster on a GPU)")
    p.add_argument("--talon-variant", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                   help="repeatable: an extra talon[...] row, the default configuration with these tree "
                   "or retrieval knobs changed, e.g. top_k=3 or mu=0.3,budget=24 (one-knob sweeps)")
    p.add_argument("--tie-tol", type=float, default=None,
                   help="near-tie tolerance floor in logits, to which 2 rounding steps of the dtype "
                   "at the best logit are added (default: 1e-3 float32, 0.05 half)")
    add_knob(p, KNOB["cost_model"], BenchConfig.cost_model,
             "how the talon methods plan on the measured cost curves: fixed = on the one "
                   "snapshot read at start (probe or cache) and predicted times only, so the same "
                   "command on the same host gives the same trees and every row plans alike; learn = "
                   "each run refines its own copy from its step timings (default: %(default)s)")
    p.add_argument("--atlas", action="store_true",
                   help="also record a draft atlas of every prompt into OUT/atlases/ (one more greedy run "
                   "plus batched draft forwards per prompt); then `python -m talon atlas sweep OUT/atlases "
                   "--grid ...` replays any configuration on them without the models")
    p.add_argument("--peer-rows", type=Path, default=None, metavar="JSONL",
                   help="rows of a peer measured outside Python (scripts/llamacpp_peer.sh) to add to the report")
    p.add_argument("--warmup-tokens", type=int, default=BenchConfig.warmup_tokens, help="0 = no warm-up")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    s = p.add_argument_group("sweep")
    s.add_argument("--sweep", action="store_true", help="grid over mu x N (x K) for --sweep-method")
    s.add_argument("--sweep-method", choices=SWEEP_METHODS, default=SweepConfig.method)
    s.add_argument("--sweep-mu", type=csv_of(float), default=SweepConfig.mus)
    s.add_argument("--sweep-budget", type=csv_of(int), default=SweepConfig.budgets)
    s.add_argument("--sweep-root-k", type=csv_of(int), default=SweepConfig.root_ks)
    return p


def bench_config(args: argparse.Namespace) -> BenchConfig:
    sweep = None
    if args.sweep:
        sweep = SweepConfig(args.sweep_method, args.sweep_mu, args.sweep_budget, args.sweep_root_k)
    methods = args.methods if args.methods is not None else (("ar",) if args.sweep else DEFAULT_METHODS)
    talon_async = {"on": True, "off": False}.get(args.talon_async, KNOB["async_draft"].default)
    for text in args.talon_variant:
        talon_variant(RunConfig(), text)  # a bad key or value fails before the models load
    return BenchConfig(
        methods=methods,
        max_new_tokens=args.max_new_tokens,
        hf_assistant_tokens=args.hf_assistant_tokens,
        pld_tokens=args.pld_tokens,
        pld_ngrams=args.pld_ngrams,
        talon_async=talon_async,
        sweep=sweep,
        talon_variants=tuple(args.talon_variant),
        tie_tol=args.tie_tol,
        warmup_tokens=args.warmup_tokens,
        cost_model=args.cost_model,
        atlas=args.atlas,
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    args = bench_parser(settings).parse_args(argv)
    command = shlex.join(["python", "-m", "talon.bench"] + (sys.argv[1:] if argv is None else argv))
    try:
        cfg = bench_config(args)
        peer_rows = read_peer_rows(args.peer_rows) if args.peer_rows else None  # a bad file fails first
        prompts = load_prompts(args.data, args.suites, args.limit or None, args.start)
        engine = build_engine(pair_from_args(args, settings, args.draft if cfg.needs_draft_model() else "none"))
        with logging_redirect_tqdm():
            report = run_bench(engine, prompts, cfg, args.out, command, not args.no_progress)
    except (ValueError, ModelLoadError, OSError) as err:  # BenchError, SuiteError, ConfigError, PromptError
        logger.error("%s", err)
        return 2
    print(speed_table([r for r in report.rows if not r.is_sweep]))
    if peer_rows:
        section = peer_section(peer_rows, report.to_dict())
        with (args.out / "results.md").open("a", encoding="utf-8") as md:
            md.write("\n" + section)
        print(section)
    if report.fatal:
        where = args.out / "results.md"
        logger.error("%d real mismatch(es) of Talon methods against ar: see %s", len(report.fatal), where)
        return 1
    return 0

