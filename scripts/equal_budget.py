"""TALON's claim at an equal budget: MAT of the adaptive tree against the static (EAGLE-2) tree.

Both trees come from the draft model alone, at the same budget N, depth limit and K/k, with
min_conf 0 and no cost planning (the bench's ``static`` and ``adaptive`` methods). Under greedy
decoding and without cost planning a run's tree does not depend on timing, so MAT (tokens per
target forward) is the same on a busy machine as on a quiet one: this script measures only MAT,
and leaves speed to ``python -m talon.bench``. Extra ``--mu`` values add adaptive variants.
Usage:

    .venv/bin/python scripts/equal_budget.py --limit 5 --max-new-tokens 64 --out bench-equal
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from talon.bench.data import default_data_dir, load_prompts  # noqa: E402
from talon.bench.options import EQUAL_BUDGET, SPECBENCH_SUITES  # noqa: E402
from talon.bench.runners import talon_run_config, talon_variant  # noqa: E402
from talon.decode import Engine, generate  # noqa: E402
from talon.models import EMBEDDED_DRAFT, EMBEDDED_TARGET, load_pair  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default=",".join(SPECBENCH_SUITES))
    parser.add_argument("--limit", type=int, default=5, help="prompts per suite (5)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--mu", default="", help="extra adaptive gates, comma list (default: only the default mu)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--draft-quant", default="auto")
    parser.add_argument("--out", type=Path, default=Path("bench-equal"))
    args = parser.parse_args()
    target, draft = load_pair(EMBEDDED_TARGET, EMBEDDED_DRAFT, args.dtype, draft_quant=args.draft_quant)
    engine = Engine(target, draft)
    configs = {m: talon_run_config(m, talon_async=False) for m in ("static", "adaptive")}
    for mu in (float(x) for x in args.mu.split(",") if x.strip()):
        configs[f"adaptive[mu={mu:g}]"] = talon_variant(configs["adaptive"], f"mu={mu}")
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
    lines = [f"| suite | {' | '.join(names)} | adaptive / static |", "| --- |" + " ---: |" * (len(names) + 1)]
    table = {}
    for suite in list(dict.fromkeys(p.suite for p in prompts)) + ["all"]:
        mats = {n: tokens[(suite, n)] / steps[(suite, n)] for n in names}
        table[suite] = mats
        cells = " | ".join(f"{mats[n]:.2f}" for n in names)
        lines.append(f"| {suite} | {cells} | {mats['adaptive'] / mats['static']:.2f}x |")
    args.out.mkdir(parents=True, exist_ok=True)
    tree = {n: dataclasses.asdict(configs[n].tree) for n in names}
    (args.out / "equal_budget.json").write_text(json.dumps({"budget": EQUAL_BUDGET, "trees": tree, "mat": table,
                                                            "prompts": args.limit, "max_new_tokens": args.max_new_tokens},
                                                           indent=1), encoding="utf-8")
    (args.out / "equal_budget.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
