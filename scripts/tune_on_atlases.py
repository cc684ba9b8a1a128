"""Tune Talon's defaults on draft atlases: every configuration of a grid (and of the planner's
constants) replayed on every atlas, under the cost model of each host given, scored by predicted
speedup over plain decoding (``drafter none`` replayed under the same cost model).

    python -m scripts.tune_on_atlases ATLAS_DIR --host amd=costs.json --host xeon=xeon \\
        --grid mu=0.05,0.1,0.2 --grid budget=8,16,24 --plan EXPLORE_MODEL_STEPS=1,3,6

``--host NAME=FILE`` takes a talon-cost/1 file; ``NAME=xeon`` alone takes the Intel Xeon curve the
issue tracker measured (float32, 2 cores: target 518 ms for 1 token, 954 for 4, 1,386 for 8,
1,566 for 16, 1,942 for 32; draft 165 ms for 1 token, its larger widths scaled like the target's;
a synthetic curve, said so in the output). Prints one markdown table per host and the
configuration whose worst host and worst suite do best, and writes every row as JSON (--out).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import talon.cost.plan as plan
from talon.atlas.data import load_atlases
from talon.atlas.sweep import SweepRow, grid_configs, parse_grid, run_sweep
from talon.cli.args import add_run_args, config_from_args
from talon.cost.model import synthetic_costs
from talon.run_config import RunConfig

XEON_VERIFY = {1: 0.518, 4: 0.954, 8: 1.386, 16: 1.566, 32: 1.942}
XEON_DRAFT = {w: 0.165 * s / XEON_VERIFY[1] for w, s in XEON_VERIFY.items()}
PLAN_KEYS = ("EXPLORE_MODEL_STEPS", "MAX_SKIPS_IN_A_ROW", "LONG_PREFILL_STEPS", "WATCH_STEPS",
             "PRIOR_STRENGTH", "POOL_STRENGTH", "ENGAGE_MARGIN")


def host_costs(spec: str) -> tuple[str, dict]:
    name, _, path = spec.partition("=")
    if not path and name == "xeon":
        return "xeon (synthetic)", synthetic_costs(XEON_VERIFY, XEON_DRAFT, other_s=0.005,
                                                   prefill_per_token_s=0.165 / 16).to_dict()
    return name, json.loads(Path(path).read_text(encoding="utf-8"))


def plan_variants(items: list[str]) -> list[dict[str, float]]:
    """Every combination of the planner constants given (KEY=V1,V2), as module overrides."""
    variants: list[dict[str, float]] = [{}]
    for item in items:
        key, _, values = item.partition("=")
        if key not in PLAN_KEYS:
            raise SystemExit(f"--plan {item!r}: KEY one of {', '.join(PLAN_KEYS)}")
        kind = type(getattr(plan, key))
        variants = [{**v, key: kind(x)} for v in variants for x in values.split(",")]
    return variants


def per_suite(row: SweepRow, suites: list[str]) -> dict[str, tuple[int, float]]:
    """suite -> (tokens, predicted seconds) of one configuration."""
    out: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for r in row.results:
        out[suites[r.atlas]][0] += r.tokens
        out[suites[r.atlas]][1] += r.predicted_s
    return {s: (int(t), sec) for s, (t, sec) in out.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("atlases", nargs="+", type=Path)
    p.add_argument("--host", action="append", default=[], help="NAME=talon-cost/1 file, or xeon")
    p.add_argument("--grid", action="append", default=[], help="KEY=V1,V2 over generate's flags")
    p.add_argument("--plan", action="append", default=[], help=f"KEY=V1,V2, KEY one of {', '.join(PLAN_KEYS)}")
    p.add_argument("--out", type=Path, default=None)
    add_run_args(p)
    args = p.parse_args()
    atlases = load_atlases(args.atlases)
    suites = [a.suite or "prompt" for a in atlases]
    configs = grid_configs(args, parse_grid(args.grid), config_from_args)
    plain = RunConfig(drafter="none", max_new_tokens=args.max_new_tokens, draft_vocab=args.draft_vocab)
    hosts = [host_costs(h) for h in args.host] or [("recorded", {})]
    rows_out = []
    score: dict[str, list[float]] = defaultdict(list)  # configuration -> worst-suite speedup per host
    overall: dict[str, list[float]] = defaultdict(list)
    start = time.perf_counter()
    for host, costs in hosts:
        for atlas in atlases:
            if costs:
                atlas.costs = costs
        base = per_suite(run_sweep(atlases, [({}, plain)], workers=1)[0], suites)
        base_all = sum(t for t, _ in base.values()) / sum(s for _, s in base.values())
        print(f"\n## {host}: plain decoding {base_all:.2f} tok/s predicted\n")
        print("| plan | configuration | MAT | speedup | worst suite | " + " | ".join(sorted(base)) + " |")
        print("| --- | --- | ---: | ---: | ---: |" + " ---: |" * len(base))
        for variant in plan_variants(args.plan):
            saved = {k: getattr(plan, k) for k in variant}
            for k, v in variant.items():
                setattr(plan, k, v)
            try:
                rows = run_sweep(atlases, configs)
            finally:
                for k, v in saved.items():
                    setattr(plan, k, v)
            for row in rows:
                suite = per_suite(row, suites)
                ratio = {s: (t / sec) / (base[s][0] / base[s][1]) for s, (t, sec) in suite.items()}
                speedup = row.tokens_per_s / base_all
                name = json.dumps({**variant, **row.values}, sort_keys=True)
                score[name].append(min(ratio.values()))
                overall[name].append(speedup)
                rows_out.append({"host": host, "plan": variant, "values": row.values, "mat": row.mat,
                                 "speedup": speedup, "suites": ratio, "coverage": row.coverage})
                print(f"| {variant or '-'} | {row.values or 'base'} | {row.mat:.2f} | {speedup:.2f}x | "
                      f"{min(ratio.values()):.2f}x | " + " | ".join(f"{ratio[s]:.2f}" for s in sorted(ratio)) + " |")
    best = max(score, key=lambda n: (min(min(score[n]), 1.0), min(overall[n])))
    print(f"\nbest over every host (worst suite held at >= 1.0x where possible, then the worst host's "
          f"overall speedup): {best}: overall {', '.join(f'{v:.2f}x' for v in overall[best])}, "
          f"worst suite {', '.join(f'{v:.2f}x' for v in score[best])}")
    print(f"{len(rows_out)} rows in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    if args.out:
        args.out.write_text(json.dumps(rows_out, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
