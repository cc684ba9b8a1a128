"""``python -m talon atlas record ...`` and ``python -m talon atlas sweep ATLAS... --grid KEY=V1,V2``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from pathlib import Path

from talon.atlas.data import Atlas, AtlasSpec, load_atlases
from talon.atlas.llamacpp import DRAFT_TOP_K
from talon.atlas.llamacpp_costs import LlamaCppCosts, parse_llamacpp_costs
from talon.atlas.serving_costs import ENGINE_COST_FORMAT, ServingCosts, TalonCurves, parse_serving_costs
from talon.atlas.serving_sweep import (
    ENGINES,
    ServingRow,
    best_serving_row,
    parse_serving_grid,
    serving_policies,
    sweep_serving,
    why_best,
)
from talon.atlas.sweep import GRID_KEYS, SweepRow, best_row, grid_configs, parse_grid, run_sweep
from talon.cli.args import add_model_args, add_run_args, config_from_args, pair_from_args
from talon.cost.model import CostModel
from talon.models import ModelLoadError
from talon.run_config import ConfigError
from talon.settings import Settings
from talon.specbench import SPECBENCH_SUITES, default_data_dir, load_prompts
from talon.trace import TraceFileError, read_json_upload

logger = logging.getLogger("talon")


def add_atlas_parser(a: argparse.ArgumentParser, settings: Settings) -> None:
    a.description = ("A draft atlas holds one prompt's greedy text and the draft model's proposals around it; "
                     "any greedy configuration replays from it exactly, in milliseconds, with no model loaded.")
    verbs = a.add_subparsers(dest="atlas_command", required=True)
    r = verbs.add_parser("record", help="record atlases (runs the models once per prompt)")
    src = r.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="read the prompt from this file")
    src.add_argument("--suites", help=f"comma list of bundled Spec-Bench suites ({', '.join(SPECBENCH_SUITES)}): "
                     "one atlas per prompt")
    r.add_argument("--limit", type=int, default=5, help="with --suites: prompts per suite (default: %(default)s)")
    r.add_argument("--start", type=int, default=0, help="with --suites: skip this many prompts of each suite")
    r.add_argument("--out", type=Path, required=True,
                   help="the atlas file (one prompt), or a folder for one file per prompt (--suites)")
    r.add_argument("--chain-depth", type=int, default=0,
                   help="also record the draft's own greedy chain this deep from every position, with its top 10 "
                   "children at each node: what llama.cpp's --spec-draft-p-min needs (depth >= its n_max)")
    add_model_args(r, settings)
    add_run_args(r)
    s = verbs.add_parser("sweep", help="replay a grid of configurations on atlases, no model needed")
    s.add_argument("atlases", nargs="+", type=Path, help="atlas files or folders of them")
    s.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help=f"repeatable; KEY one of {', '.join(GRID_KEYS)}; or rule=talon,fixed,hf-heuristic,... "
                   "and the rules' own knobs (docs/atlas.md: adaptive draft length)")
    s.add_argument("--json", action="store_true", help="print every row (configuration, MAT, ...) as JSON")
    s.add_argument("--workers", type=int, default=0, help="processes (default: one per core)")
    s.add_argument("--costs", type=Path, default=None,
                   help="a talon-cost/1 file (e.g. from ~/.cache/talon/costs) that replaces every atlas's cost "
                   "model: predict time and plan as on that host, from atlases recorded on this one; with "
                   "--engine also a talon-engine-cost/1 file (scripts/serve_check.sh writes vLLM's; "
                   "talon costs --llama-bench writes llama.cpp's)")
    s.add_argument("--engine", choices=ENGINES, default=None,
                   help="sweep a serving engine's own knobs instead of Talon's, replaying that engine's drafting "
                   "(vllm: method, k, prompt_lookup_min, prompt_lookup_max; sglang: topk, num_steps, "
                   "num_draft_tokens; llamacpp: type, n_max, n_min, p_min, size_n, size_m, n_match, ngram_n_min, "
                   "ngram_n_max), ranked by predicted tokens/s")
    add_run_args(s)


def atlas_command(args: argparse.Namespace, settings: Settings) -> int:
    if args.atlas_command == "record":
        return record_command(args, settings)
    return sweep_command(args)


def record_command(args: argparse.Namespace, settings: Settings) -> int:
    try:
        cfg = config_from_args(args)
        if args.suites:
            prompts = [(f"{p.suite}-{p.index}", p.text, p.suite) for p in
                       load_prompts(default_data_dir(), [s.strip() for s in args.suites.split(",")], args.limit,
                                    args.start)]
        else:
            text = args.prompt if args.prompt is not None else Path(args.prompt_file).read_text(encoding="utf-8")
            prompts = [("atlas", text, "")]
        spec = dataclasses.replace(AtlasSpec(), chain_depth=args.chain_depth)
        from talon.atlas.record import record_atlas  # torch: only the command that loads a model
        from talon.engine.build import build_engine

        if cfg.needs_mtp:  # the target's own MTP layer drafts: refused before any weight loads, no draft model
            from talon.models.mtp import check_mtp_spec

            check_mtp_spec(args.target)
        engine = build_engine(pair_from_args(args, settings, "none" if cfg.needs_mtp else args.draft))
        for name, text, suite in prompts:
            atlas = record_atlas(engine, text, cfg, spec, suite=suite,
                                 progress=lambda f, what: logger.info("%3.0f%% %s", 100 * f, what))
            path = args.out / f"{name}.json" if args.suites else args.out
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(atlas.to_dict()), encoding="utf-8")
            rec = atlas.record
            logger.info("%s: %d tokens, %d nodes; run %.1f s + atlas %.1f s = %.2fx the run",
                        path, len(atlas.output), len(atlas.children), rec["run_s"], rec["atlas_s"], rec["ratio"])
    except (ValueError, ModelLoadError, OSError) as err:
        logger.error("%s", err)
        return 2
    return 0


def sweep_command(args: argparse.Namespace) -> int:
    try:
        atlases = load_atlases(args.atlases)
        costs = read_json_upload(args.costs) if args.costs is not None else None
        serving_costs = None
        if isinstance(costs, dict) and costs.get("format") == ENGINE_COST_FORMAT and args.engine:
            try:
                serving_costs = (parse_llamacpp_costs(costs) if costs.get("engine") == "llamacpp"
                                 else parse_serving_costs(costs))
            except ValueError as error:
                raise TraceFileError(f"{args.costs}: {error}") from None
        elif costs is not None:
            try:
                CostModel.from_dict(costs)
            except (ValueError, KeyError, TypeError) as error:
                raise TraceFileError(f"{args.costs}: not a talon-cost/1 file ({error})") from None
            for atlas in atlases:
                atlas.costs = costs
        if args.engine:
            return serving_sweep_command(args, atlases, serving_costs)
        if any(g.startswith("rule=") for g in args.grid):
            return rule_sweep_command(args, atlases)
        configs = grid_configs(args, parse_grid(args.grid), config_from_args)
    except (ConfigError, TraceFileError, OSError) as err:
        logger.error("%s", err)
        return 2
    start = time.perf_counter()
    try:
        rows = run_sweep(atlases, configs, args.workers)
    except ConfigError as err:
        logger.error("%s", err)
        return 2
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps({"atlases": [{"prompt": a.prompt[:200], "suite": a.suite, "tokens": len(a.output)}
                                      for a in atlases], "seconds": seconds, "rows": [r.to_dict() for r in rows]}))
    else:
        print(sweep_table(rows))
        best = best_row(rows)
        print(f"\nbest by predicted tokens/s: {best.values or 'the base command'} "
              f"(MAT {best.mat:.2f}, {best.tokens_per_s:.2f} tok/s predicted)")
    logger.info("%d configurations x %d atlases replayed in %.1f s", len(rows), len(atlases), seconds)
    return 0


def rule_sweep_command(args: argparse.Namespace, atlases: list[Atlas]) -> int:
    """``--grid rule=...``: the adaptive draft-length rules beside TALON's gate, on the atlases
    in the order given (one server's requests), ranked by predicted tokens/s."""
    from talon.atlas.adaptive_sweep import parse_rule_grid, rule_table, sweep_rules

    try:
        points = parse_rule_grid(args.grid)
        base = config_from_args(args)
    except ConfigError as err:
        logger.error("%s", err)
        return 2
    rows = sweep_rules(atlases, points, base)
    if args.json:
        print(json.dumps({"rows": [r.to_dict() for r in rows]}))
    else:
        print(rule_table(rows))
        print(f"\nbest by predicted tokens/s: {rows[0].label()} (MAT {rows[0].mat:.2f}, "
              f"{rows[0].tokens_per_s:.2f} tok/s predicted on {atlases[0].cost_model().provenance.describe()})")
    return 0


def serving_sweep_command(args: argparse.Namespace, atlases: list[Atlas],
                          costs: ServingCosts | LlamaCppCosts | None) -> int:
    """``--engine``: the engine's knobs, replayed as that engine drafts, ranked by predicted tok/s."""
    try:
        kinds = {atlas.draft_kind for atlas in atlases}
        if len(kinds) > 1:
            raise ConfigError("these atlases were recorded with a draft model and with an EAGLE-3 head: sweep each "
                              "kind on its own (an engine drafts with one of them)")
        grid = parse_serving_grid(args.engine, args.grid)
        chained = all(a.spec.chain_depth >= max(grid.get("n_max", [0])) and a.spec.chain_k >= DRAFT_TOP_K
                      for a in atlases)
        if args.engine == "llamacpp" and not chained and not any(g.startswith("p_min") for g in args.grid):
            grid["p_min"] = [0.0]  # the default grid's p_min needs the draft's chains (--chain-depth)
            logger.info("p_min held at 0: these atlases hold no draft chains deep enough (record with --chain-depth)")
        policies = serving_policies(args.engine, grid, kinds.pop())
    except ConfigError as err:
        logger.error("%s", err)
        return 2
    if costs is not None and costs.serving != args.engine:
        logger.error("%s holds %s's step costs, not %s's", args.costs, costs.serving, args.engine)
        return 2
    start = time.perf_counter()
    rows = sweep_serving(atlases, policies, costs)
    seconds = time.perf_counter() - start
    timing = costs.label if costs is not None else TalonCurves(atlases[0].cost_model()).label
    if args.json:
        print(json.dumps({"engine": args.engine, "timing": timing, "seconds": seconds,
                          "rows": [r.to_dict() for r in rows]}))
    else:
        print(serving_table(rows))
        best = best_serving_row(rows)
        print(f"\ntimes: {timing}")
        print(f"best by predicted tokens/s: {why_best(rows, best)}")
    logger.info("%d %s configurations x %d atlases replayed in %.1f s", len(rows), args.engine, len(atlases), seconds)
    return 0


def serving_table(rows: list[ServingRow]) -> str:
    """The engine's knobs, its own acceptance metric, coverage and predicted speed."""
    keys = list(dict.fromkeys(k for r in rows for k in r.knobs))
    serving = rows[0].serving if rows else "vllm"
    metric = "spec_accept_length" if serving == "sglang" else "mean acceptance length"
    llama = serving == "llamacpp"
    head = keys + [metric, "drafts"] + (["draft_n"] if llama else []) + [
        "accepted", "tok/s (pred.)", "coverage", "near-ties"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        cover = "exact" if r.misses == 0 else f"{100 * r.coverage:.1f} %"
        lines.append(" | ".join([str(r.knobs.get(k, "–")) for k in keys] + [
            f"{r.acceptance:.3f}", str(r.num_drafts)] + ([str(r.num_draft_tokens)] if llama else []) + [
            str(r.num_accepted), f"{r.tokens_per_s:.2f}", cover, str(r.near_ties)]))
    return "\n".join(lines)


def sweep_table(rows: list[SweepRow]) -> str:
    keys = list(rows[0].values) if rows else []
    head = keys + ["MAT", "tok/s (pred.)", "step ms (pred.)", "coverage"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        cover = "exact" if r.exact else f"{100 * r.coverage:.1f} %"
        lines.append(" | ".join([str(r.values[k]) for k in keys]
                                + [f"{r.mat:.3f}", f"{r.tokens_per_s:.2f}", f"{1e3 * r.step_s:.0f}", cover]))
    return "\n".join(lines)
