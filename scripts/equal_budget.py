"""TALON's claim at an equal budget: MAT of the adaptive tree against the static (EAGLE-2) tree.

Both trees come from the draft model alone, at the same budget N, depth limit and K/k, with
min_conf 0 and no cost planning (the bench's ``static`` and ``adaptive`` methods), each ranked
both ways (``TreeConfig.admission``): by calibrated acceptance (the default) and by raw path
confidence, so the table shows per suite what the shape and what the ranking are worth. Under
greedy decoding and without cost planning a run's tree does not depend on timing, so MAT (tokens
per target forward) is the same on a busy machine as on a quiet one: this script measures only
MAT, and leaves speed to ``python -m talon.bench``. Extra ``--mu`` values add adaptive variants
(ranked by the first ``--admission``). Usage:

    .venv/bin/python -m scripts.equal_budget --limit 5 --max-new-tokens 64 --out bench-equal
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import defaultdict
from pathlib import Path

from talon.bench.options import EQUAL_BUDGET
from talon.bench.runners import talon_run_config, talon_variant
from talon.engine.engine import Engine, generate
from talon.models import EMBEDDED_DRAFT, EMBEDDED_TARGET, load_pair
from talon.run_config import ADMISSIONS
from talon.specbench import SPECBENCH_SUITES, default_data_dir, load_prompts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default=",".join(SPECBENCH_SUITES))
    parser.add_argument("--limit", type=int, default=5, help="prompts per suite (5)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--mu", default="", help="extra adaptive gates, comma list (default: only the default mu)")
    parser.add_argument("--admission", default=",".join(ADMISSIONS),
                        help="rankings to compare, comma list of calibrated, confidence (default: both)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--draft-quant", default="auto")
    parser.add_argument("--out", type=Path, default=Path("bench-equal"))
    args = parser.parse_args()
    target, draft = load_pair(EMBEDDED_TARGET, EMBEDDED_DRAFT, args.dtype, draft_quant=args.draft_quant)
    engine = Engine(target, draft)
    admissions = [a.strip() for a in args.admission.split(",") if a.strip()]
    configs = {
        f"{mode}[{admission}]": talon_variant(talon_run_config(mode, talon_async=False), f"admission={admission}")
        for admission in admissions
        for mode in ("static", "adaptive")
    }
    for mu in (float(x) for x in args.mu.split(",") if x.strip()):
        configs[f"adaptive[{admissions[0]},mu={mu:g}]"] = talon_variant(
            configs[f"adaptive[{admissions[0]}]"], f"mu={mu}")
    prompts = load_prompts(default_data_dir(), args.suites.split(","), args.limit)
    tokens: dict[tuple[str, str], int] = defaultdict(int)
    steps: dict[tuple[str, str], int] = defaultdict(int)
    for prompt in prompts:
        for name, cfg in configs.items():
            summary, _ = generate(engine, prompt.text, cfg.replace(max_new_tokens=args.max_new_tokens))
            for suite in (prompt.suite, "all"):
                tokens[(suite, name)] += len(summary.token_ids)
                steps[(suite, name)] += summary.steps
            print(f"{prompt.suite}#{prompt.index} {name}: MAT {len(summary.token_ids) / summary.steps:.2f}",
                  file=sys.stderr, flush=True)
    names = list(configs)
    ratios = [f"adaptive / static [{a}]" for a in admissions]
    if len(admissions) > 1:
        ratios += [f"{mode} {admissions[0]} / {admissions[1]}" for mode in ("static", "adaptive")]
    lines = [f"| suite | {' | '.join(names + ratios)} |", "| --- |" + " ---: |" * (len(names) + len(ratios))]
    table = {}
    for suite in list(dict.fromkeys(p.suite for p in prompts)) + ["all"]:
        mats = {n: tokens[(suite, n)] / steps[(suite, n)] for n in names}
        table[suite] = mats
        shares = [mats[f"adaptive[{a}]"] / mats[f"static[{a}]"] for a in admissions]
        if len(admissions) > 1:
            shares += [mats[f"{mode}[{admissions[0]}]"] / mats[f"{mode}[{admissions[1]}]"]
                       for mode in ("static", "adaptive")]
        cells = " | ".join([f"{mats[n]:.2f}" for n in names] + [f"{r:.2f}x" for r in shares])
        lines.append(f"| {suite} | {cells} |")
    args.out.mkdir(parents=True, exist_ok=True)
    tree = {n: dataclasses.asdict(configs[n].tree) for n in names}
    (args.out / "equal_budget.json").write_text(json.dumps({"budget": EQUAL_BUDGET, "trees": tree, "mat": table,
                                                            "prompts": args.limit,
                                                            "max_new_tokens": args.max_new_tokens},
                                                           indent=1), encoding="utf-8")
    (args.out / "equal_budget.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
