"""Every adaptive draft-length rule at its defaults and at its best on a set of atlases, beside
TALON's gate, as a markdown table (the run files under docs/runs/):

    .venv/bin/python -m scripts.adaptive_table ATLAS_OR_DIR ... [--budget 16] [--costs FILE]

Atlases are read in the order given (rules with state carry it from one to the next, as a
server's requests); times are predicted on each atlas's own cost curves, or on a talon-cost/1
file's (``--costs``, e.g. from ~/.cache/talon/costs: another host's, or this one's another way)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from talon.atlas.adaptive_sweep import best_per_rule
from talon.atlas.data import load_atlases
from talon.cost.model import CostModel
from talon.run_config import RunConfig, TreeConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("atlases", nargs="+", type=Path)
    parser.add_argument("--budget", type=int, default=16, help="TALON's node budget N (default: %(default)s)")
    parser.add_argument("--costs", type=Path, default=None, help="a talon-cost/1 file to predict times on")
    args = parser.parse_args(argv)
    atlases = load_atlases(args.atlases)
    if args.costs is not None:
        costs = json.loads(args.costs.read_text(encoding="utf-8"))
        CostModel.from_dict(costs)  # refused here if it is not a cost file
        for atlas in atlases:
            atlas.costs = costs
    base = RunConfig(drafter="model", tree=TreeConfig(budget=args.budget))
    bests = best_per_rule(atlases, base)
    print(f"{len(atlases)} atlases, {sum(len(a.output) for a in atlases)} tokens; TALON at N = {args.budget}, "
          f"the draft alone; costs: {atlases[0].cost_model().provenance.describe()}\n")
    print("| rule | MAT, defaults | tok/s, defaults | best setting | MAT, best | tok/s, best | outside the atlas |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: |")
    for b in bests:
        changed = ", ".join(f"{k}={v}" for k, v in b.best.setting.items()) or "its defaults"
        print(f"| {b.rule} | {b.defaults.mat:.2f} | {b.defaults.tokens_per_s:.2f} | {changed} | {b.best.mat:.2f} | "
              f"{b.best.tokens_per_s:.2f} | {b.best.misses} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
