"""`python -m talon generate ...`: run one prompt from the command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from talon.atlas.cli import add_atlas_parser, atlas_command
from talon.cost import MAX_AGE_DAYS, CostModel, cache_path, load_or_probe
from talon.decode import Engine, generate
from talon.models import ModelLoadError, load_pair
from talon.run_config import (
    ADMISSIONS,
    RetrievalConfig,
    RunConfig,
    SamplingConfig,
    TreeConfig,
)
from talon.settings import Settings
from talon.trace import dump_trace

log = logging.getLogger("talon")


def add_model_args(p: argparse.ArgumentParser, settings: Settings) -> None:
    p.add_argument("--target", default=settings.target, help="hub id, local dir, .gguf, or embedded:... (default: %(default)s)")
    p.add_argument("--draft", default=settings.draft, help="like --target, or 'none' (default: %(default)s)")
    p.add_argument("--dtype", default=settings.dtype, choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--device", default=settings.device, help="auto, cpu, cuda or cuda:N")
    p.add_argument("--draft-quant", default=settings.draft_quant, choices=["auto", "none", "int8"],
                   help="draft weights: int8 (fbgemm, CPU only; faster draft forwards, the output stays "
                   "the target's), none, or auto = int8 on a CPU (default: %(default)s)")


def add_run_args(p: argparse.ArgumentParser) -> None:
    """Every RunConfig knob; defaults come from the dataclasses so there is one source."""
    t, r, s, run = TreeConfig(), RetrievalConfig(), SamplingConfig(), RunConfig()
    p.add_argument("--drafter", default=run.drafter, choices=["hybrid", "model", "retrieval", "none"])
    p.add_argument("--tree", default=t.mode, choices=["adaptive", "static", "chain"])
    p.add_argument("--budget", type=int, default=t.budget, help="N: draft nodes per verification")
    p.add_argument("--root-k", type=int, default=t.root_k, help="K: children of the root (never gated)")
    p.add_argument("--top-k", type=int, default=t.top_k, help="k: children per expanded tree node")
    p.add_argument("--mu", type=float, default=t.mu, help="gate: expand iff path_conf >= mu * layer max")
    p.add_argument("--max-depth", type=int, default=t.max_depth)
    p.add_argument("--min-conf", type=float, default=t.min_conf,
                   help="expand a layer only while its best path confidence is >= this (0 = off)")
    p.add_argument("--cost-aware", choices=["on", "off"], default="on" if t.cost_aware else "off",
                   help="goodput planning: a measured cost model (verify time vs tree size, draft time "
                   "per layer, probed once and cached; see --cost-model) and an acceptance model "
                   "calibrated per source stop the tree when the next layer does not pay, trim "
                   "unprofitable nodes and skip the draft model (and its prefill) on steps where "
                   "retrieval alone is expected to be faster; off = pure TALON budget fill (%(default)s)")
    p.add_argument("--admission", choices=list(ADMISSIONS), default=t.admission,
                   help="what ranks the nodes competing for the budget (adaptive and static trees): "
                   "calibrated = the acceptance model's P(node accepted), learnt per source during the "
                   "run; confidence = the raw product of q (%(default)s)")
    p.add_argument("--cost-model", choices=["fixed", "learn"], default=run.cost_model,
                   help="fixed = plan on the measured curves as read at start (probe or cache) and on "
                   "predicted times only, so the same command gives the same trees; learn = refine "
                   "this run's copy from its own step timings (%(default)s; sampled runs always plan "
                   "fixed). `python -m talon costs --show` prints the curves and where they came from")
    p.add_argument("--retrieval-min-match", type=int, default=r.min_match)
    p.add_argument("--retrieval-max-continuation", type=int, default=r.max_continuation)
    p.add_argument("--graft-threshold", type=int, default=r.graft_threshold,
                   help="hybrid: graft retrieval when its match is at least this long")
    p.add_argument("--retrieval-branches", type=int, default=r.max_branches)
    p.add_argument("--corpus", default=None, help="jsonl/text file for a static retrieval datastore")
    p.add_argument("--temperature", type=float, default=s.temperature, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=s.top_p)
    p.add_argument("--sample-top-k", type=int, default=s.top_k, help="sampling top-k (0 = off)")
    p.add_argument("--seed", type=int, default=s.seed)
    p.add_argument("--max-new-tokens", type=int, default=run.max_new_tokens)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--no-chat-template", action="store_true")
    p.add_argument("--async", dest="async_draft", action="store_const", const=True, default=None,
                   help="pre-draft the next tree while the target verifies (default: on CUDA only)")
    p.add_argument("--no-async", dest="async_draft", action="store_const", const=False)
    p.add_argument("--draft-vocab", type=int, default=run.draft_vocab,
                   help="draft logits over the first V token ids only (0 = full vocabulary)")


def run_config(a: argparse.Namespace) -> RunConfig:
    return RunConfig(
        drafter=a.drafter,
        tree=TreeConfig(a.tree, a.budget, a.root_k, a.top_k, a.mu, a.max_depth, a.min_conf, a.cost_aware == "on",
                        a.admission),
        retrieval=RetrievalConfig(
            a.retrieval_min_match, a.retrieval_max_continuation, a.graft_threshold,
            a.retrieval_branches, a.corpus,
        ),
        sampling=SamplingConfig(a.temperature, a.top_p, a.sample_top_k, a.seed),
        max_new_tokens=a.max_new_tokens,
        stop_strings=tuple(a.stop),
        chat_template=not a.no_chat_template,
        async_draft=bool(a.async_draft),
        draft_vocab=a.draft_vocab,
        cost_model=a.cost_model,
    )


def parser(settings: Settings) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m talon", description="Talon tree speculative decoding")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate from one prompt")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="read the prompt from this file")
    add_model_args(g, settings)
    add_run_args(g)
    g.add_argument("--trace-out", help="write every step's trace (JSON) here")
    g.add_argument("--json", action="store_true", help="print one JSON object to stdout")
    c = sub.add_parser("costs", help="show, re-measure or remove the cached cost curves",
                       description=f"The measured cost curves, cached under {settings.cost_cache_dir} "
                       "(TALON_COST_CACHE, else TALON_CACHE/costs), one file per model pair, dtype, "
                       "device, draft vocabulary, hardware, torch version and thread count.")
    what = c.add_mutually_exclusive_group(required=True)
    what.add_argument("--show", action="store_true", help="list every cached model: where and when measured, key figures")
    what.add_argument("--probe", action="store_true", help="measure the curves of the given pair now and cache them")
    what.add_argument("--clear", action="store_true", help="remove every cached cost model")
    add_model_args(c, settings)
    c.add_argument("--draft-vocab", type=int, default=RunConfig().draft_vocab,
                   help="draft logits over the first V token ids (as in generate; default: %(default)s)")
    add_atlas_parser(sub, settings, add_model_args, add_run_args)
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    p = parser(settings)
    args = p.parse_args(argv)
    if args.command == "costs":
        return costs_command(args, settings)
    if args.command == "atlas":
        return atlas_command(args, settings, p._subparsers._group_actions[0].choices["generate"], run_config)
    if args.draft.lower() == "none" and args.drafter == "hybrid":
        log.info("--draft none: drafting from retrieval only")
        args.drafter = "retrieval"
    try:
        cfg = run_config(args)
        prompt = args.prompt
        if args.prompt_file:
            with open(args.prompt_file, encoding="utf-8") as fh:
                prompt = fh.read()
        draft = None if args.drafter in ("none", "retrieval") else args.draft
        target, draft_lm = load_pair(
            args.target, draft, args.dtype, args.device, settings.allow_remote_code, draft_quant=args.draft_quant
        )
        if args.async_draft is None:  # overlap pays where drafter and verifier have their own hardware
            cfg = cfg.replace(async_draft=target.device.type == "cuda")
        summary, steps = generate(Engine(target, draft_lm, cost_cache=settings.cost_cache_dir), prompt, cfg)
    except (ValueError, ModelLoadError, OSError) as err:  # ConfigError, PromptError, bad corpus
        log.error("%s", err)
        return 2
    if args.trace_out:
        dump_trace(args.trace_out, summary, steps)
    if args.json:
        print(json.dumps(summary.to_dict()))
    else:
        print(summary.text)
        log.info(
            "%d tokens, %d steps, MAT %.2f, %.2f tokens/s, %.1f s",
            len(summary.token_ids), summary.steps, summary.mean_accepted_tokens,
            summary.tokens_per_second, summary.seconds,
        )
    return 0


def costs_command(args: argparse.Namespace, settings: Settings) -> int:
    """``python -m talon costs --show | --probe | --clear``."""
    folder = settings.cost_cache_dir
    if args.clear:
        removed = [p for p in sorted(folder.glob("*.json")) if p.is_file()]
        for path in removed:
            path.unlink()
        print(f"removed {len(removed)} cached cost model(s) from {folder}")
        return 0
    if args.show:
        files = sorted(folder.glob("*.json"))
        print(f"{len(files)} cached cost model(s) in {folder}")
        for path in files:
            print(describe_cached(path))
        return 0
    try:
        draft = None if args.draft.lower() == "none" else args.draft
        target, draft_lm = load_pair(
            args.target, draft, args.dtype, args.device, settings.allow_remote_code, draft_quant=args.draft_quant
        )
        names = (target.name, draft_lm.name if draft_lm is not None else "none")
        costs = load_or_probe(target.model, draft_lm.model if draft_lm is not None else None, names,
                              folder, args.draft_vocab, refresh=True)
    except (ValueError, ModelLoadError, OSError) as err:
        log.error("%s", err)
        return 2
    print(describe_cached(cache_path(folder, costs.key)))
    return 0


def describe_cached(path: Path) -> str:
    """A few lines about one cached cost model: what it is for, where it came from, key figures."""
    try:
        costs = CostModel.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as err:
        return f"{path.name}: unreadable ({err})"
    age = costs.provenance.age_days()
    stale = " (stale: measured again at next use)" if age is None or age > MAX_AGE_DAYS else ""
    draft = f", draft layer 1/4/16 nodes {_ms(costs.draft_s(1))}/{_ms(costs.draft_s(4))}/{_ms(costs.draft_s(16))}" \
        if costs.draft is not None else ""
    return (f"{path.name}: {costs.key}\n  {costs.provenance.describe()}, "
            f"{'?' if age is None else f'{age:.1f}'} days old{stale}\n"
            f"  verify 1/4/16/64 nodes {_ms(costs.verify_s(1))}/{_ms(costs.verify_s(4))}/"
            f"{_ms(costs.verify_s(16))}/{_ms(costs.verify_s(64))}{draft}")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms"
