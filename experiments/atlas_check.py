"""Measure the draft atlas on real models: what recording costs against one run, how much of a
grid of configurations it covers, and whether replays equal real runs (MAT and per-step lengths).

    python -m experiments.atlas_check --suites humaneval,sum --limit 1 --max-new-tokens 64 --dtype float32

Prints one JSON object: per prompt the run and atlas seconds and their ratio, then per
(configuration, prompt) the real and replayed MAT, whether every step agreed, the coverage, and
for a disagreement the reason (``compare_runs``: a near-tie of the draft's q, or a miss).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from talon.atlas.data import AtlasSpec
from talon.atlas.loop import compare_runs
from talon.atlas.record import record_atlas
from talon.atlas.replay import replay
from talon.engine.engine import Engine, generate
from talon.models import load_pair
from talon.run_config import RetrievalConfig, RunConfig, TreeConfig
from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET
from talon.specbench import default_data_dir, load_prompts


def grid(tokens: int) -> list[RunConfig]:
    """Every drafter and tree mode once, a narrow and a wide tree, short matches, and cost-aware
    planning on the engine's fixed snapshot (which the atlas stores)."""
    off = {"cost_aware": False}
    return [
        RunConfig(tree=TreeConfig(**off), max_new_tokens=tokens),
        RunConfig(drafter="model", tree=TreeConfig(mode="chain", **off), max_new_tokens=tokens),
        RunConfig(tree=TreeConfig(mode="static", **off), max_new_tokens=tokens),
        RunConfig(tree=TreeConfig(mu=0.3, budget=8, **off), max_new_tokens=tokens,
                  retrieval=RetrievalConfig(min_match=1, graft_threshold=2)),
        RunConfig(drafter="model", tree=TreeConfig(root_k=8, top_k=4, max_depth=12, min_conf=0.0, budget=32, **off),
                  max_new_tokens=tokens),
        RunConfig(tree=TreeConfig(cost_aware=True), max_new_tokens=tokens, cost_model="fixed"),
    ]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--suites", default="mt_bench,humaneval,gsm8k,alpaca,sum,qa")
    p.add_argument("--limit", type=int, default=1)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--n-nodes", type=int, default=AtlasSpec.n_nodes)
    p.add_argument("--no-compare", action="store_true", help="only measure the recording")
    p.add_argument("--out", type=Path, default=None, help="write the atlases here")
    a = p.parse_args()
    target, draft = load_pair(EMBEDDED_TARGET, EMBEDDED_DRAFT, dtype=a.dtype, device="cpu")
    engine = Engine(target, draft)
    prompts = load_prompts(default_data_dir(), a.suites.split(","), a.limit, a.start)
    base = RunConfig(max_new_tokens=a.max_new_tokens)
    spec = AtlasSpec(n_nodes=a.n_nodes)
    generate(engine, "Say hi.", base.replace(max_new_tokens=4))  # warm up
    report = {"cpu": platform.processor() or platform.machine(), "dtype": a.dtype, "prompts": [], "pairs": []}
    for prompt in prompts:
        t0 = time.perf_counter()
        atlas = record_atlas(engine, prompt.text, base, spec, suite=prompt.suite)
        total = time.perf_counter() - t0
        rec = atlas.record
        report["prompts"].append({"suite": prompt.suite, "index": prompt.index, "tokens": len(atlas.output),
                                  "run_s": rec["run_s"], "atlas_s": rec["atlas_s"], "ratio": rec["ratio"],
                                  "total_s": round(total, 2), "entries": rec["entries"], "rows": rec["rows"]})
        print(json.dumps(report["prompts"][-1]), file=sys.stderr, flush=True)
        if a.out:
            a.out.mkdir(parents=True, exist_ok=True)
            (a.out / f"{prompt.suite}-{prompt.index}.json").write_text(json.dumps(atlas.to_dict()))
        if a.no_compare:
            continue
        for cfg in grid(a.max_new_tokens):
            _, steps = generate(engine, prompt.text, cfg)
            result = replay(atlas, cfg)
            agree = compare_runs(steps, result.steps, coverage=result.coverage)
            row = {"suite": prompt.suite, "drafter": cfg.drafter, "tree": cfg.tree.mode, "budget": cfg.tree.budget,
                   "mu": cfg.tree.mu, "root_k": cfg.tree.root_k, "top_k": cfg.tree.top_k,
                   "cost_aware": cfg.tree.cost_aware,
                   "real_mat": sum(len(s.new_tokens) for s in steps) / len(steps), "replay_mat": result.mat,
                   "equal": agree.equal, "near_tie": agree.near_tie, "outside": agree.outside,
                   "coverage": round(result.coverage.share, 4), "reason": agree.reason,
                   "first_miss": result.coverage.first_miss}
            report["pairs"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    pairs = report["pairs"]
    if pairs:
        report["equal_share"] = sum(r["equal"] for r in pairs) / len(pairs)
        report["mat_equal_share"] = sum(abs(r["real_mat"] - r["replay_mat"]) < 1e-9 for r in pairs) / len(pairs)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
