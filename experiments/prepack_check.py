"""Float32 weights laid out once for oneDNN (``talon.models.prepack``) against torch's default
matmul, on the embedded pair: the same tokens, and what it changes in the forward and the loop.

    python -m experiments.prepack_check --out docs/bench_runs/prepack.json      # 2 prompts a suite
    python -m experiments.prepack_check --per-suite 1 --tokens 32 --sizes 1,4   # quicker

The target is loaded twice, as loaded and prepacked (about 13 GB in float32). First one target
forward of each size (``--sizes`` new tokens over a ``PREFIX``-token cache; best of ``--reps``,
the two in turn). Then each drafter (``--drafters``; the engine's defaults otherwise, the
cost-aware planner probing each pair's curves afresh into a temporary folder) on ``--per-suite``
Spec-Bench prompts of every suite, each prompt both ways in turn: tok/s, where the time went,
and whether the tokens were the same. Prints one JSON report (also ``--out``). Run it with
nothing else on the cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from scripts.report import emit
from talon.core.forward import forward_hidden
from talon.models import EMBEDDED_DRAFT, EMBEDDED_TARGET, cpu_model, load_pair
from talon.models.head import lm_logits
from talon.models.prepack import CHECK_ROWS, time_layer

PREFIX = 256
WAYS = ("plain", "prepacked")


def forward_times(targets: dict[str, Any], sizes: list[int], reps: int) -> dict[str, Any]:
    """Best time of one target forward of each size (and its LM head) over a PREFIX-token cache."""
    from transformers import DynamicCache

    ids = torch.randint(0, 1000, (PREFIX + max(sizes),), generator=torch.Generator().manual_seed(0))
    best: dict[tuple[str, int], float] = {}
    logits: dict[tuple[str, int], torch.Tensor] = {}
    with torch.inference_mode():
        for _ in range(reps):
            for size in sizes:
                for way, lm in targets.items():
                    cache = DynamicCache(config=lm.model.config)
                    forward_hidden(lm.model, cache, ids[:PREFIX], torch.arange(PREFIX), None)
                    start = time.perf_counter()
                    hidden = forward_hidden(lm.model, cache, ids[PREFIX:PREFIX + size],
                                            torch.arange(PREFIX, PREFIX + size), None)
                    out = lm_logits(lm.model, hidden)
                    seconds = time.perf_counter() - start
                    best[way, size] = min(best.get((way, size), seconds), seconds)
                    logits[way, size] = out
    return {str(size): {"plain_ms": round(best["plain", size] * 1e3, 1),
                        "prepacked_ms": round(best["prepacked", size] * 1e3, 1),
                        "ratio": round(best["prepacked", size] / best["plain", size], 3),
                        "max_logit_diff": float((logits["plain", size] - logits["prepacked", size]).abs().max()),
                        "same_argmax": bool(torch.equal(logits["plain", size].argmax(-1),
                                                        logits["prepacked", size].argmax(-1)))}
            for size in sizes}


def loop(pairs: dict[str, Any], drafters: list[str], per_suite: int, tokens: int, planner: str) -> dict[str, Any]:
    """Each drafter on ``per_suite`` prompts of each Spec-Bench suite, both ways in turn.
    ``planner``: ``free`` (the cost-aware planner on each pair's own probed curves: it may draft
    other trees on the two layouts) or ``fixed`` (the planner off: both arms draft the same
    trees, so the ratio is the layout's alone)."""
    from talon.engine.engine import Engine, generate
    from talon.run_config import RunConfig
    from talon.specbench import SPECBENCH_SUITES, default_data_dir, load_prompts

    costs = Path(tempfile.mkdtemp(prefix="talon-prepack-costs-"))
    engines = {way: Engine(*pair, cost_cache=costs) for way, pair in pairs.items()}
    prompts = load_prompts(default_data_dir(), SPECBENCH_SUITES, limit=per_suite)
    report: dict[str, Any] = {}
    for drafter in drafters:
        cfg = RunConfig(drafter=drafter, max_new_tokens=tokens)
        if planner == "fixed":
            cfg = cfg.replace(tree=dataclasses.replace(cfg.tree, cost_aware=False))
        for engine in engines.values():
            generate(engine, prompts[0].text, cfg)  # warm (and the cost probe, once per pair)
        totals = {w: {"seconds": 0.0, "tokens": 0, "steps": 0, "draft_s": 0.0, "verify_s": 0.0, "other_s": 0.0}
                  for w in WAYS}
        suites: dict[str, dict[str, float]] = {}
        same = True
        for i, prompt in enumerate(prompts):
            ids = {}
            for way in (WAYS if i % 2 == 0 else WAYS[::-1]):
                summary, _ = generate(engines[way], prompt.text, cfg)
                ids[way] = summary.token_ids
                t = totals[way]
                t["seconds"] += summary.seconds
                t["tokens"] += len(summary.token_ids)
                t["steps"] += summary.steps
                for k in ("draft_s", "verify_s", "other_s"):
                    t[k] += getattr(summary, k)
                suites.setdefault(prompt.suite, dict.fromkeys(WAYS, 0.0))[way] += summary.seconds
            same &= ids["plain"] == ids["prepacked"]
            print(planner, drafter, prompt.suite, prompt.index, {w: round(suites[prompt.suite][w], 1) for w in WAYS},
                  flush=True)
        out: dict[str, Any] = {w: {"tok_s": round(t["tokens"] / t["seconds"], 3),
                                   "MAT": round(t["tokens"] / max(t["steps"], 1), 2),
                                   **{k: round(x, 2) for k, x in t.items()}} for w, t in totals.items()}
        out["prepacked/plain seconds"] = round(totals["prepacked"]["seconds"] / totals["plain"]["seconds"], 3)
        out["by suite, prepacked/plain seconds"] = {s: round(v["prepacked"] / v["plain"], 3) for s, v in suites.items()}
        out["same_tokens"] = same
        report[drafter] = out
    report["prompts"], report["tokens_each"], report["planner"] = len(prompts), tokens, planner
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1,2,4,8,16,32,64")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--drafters", default="none,hybrid")
    p.add_argument("--per-suite", type=int, default=2)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--skip-forwards", action="store_true")
    p.add_argument("--planner", default="fixed,free",
                   help="comma list: fixed (cost-aware planning off, the same trees both ways: the layout's own "
                        "effect) and/or free (each pair's planner on its own probed curves)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    pairs = {way: load_pair(EMBEDDED_TARGET, EMBEDDED_DRAFT, "float32", "cpu", draft_quant="auto",
                            prepack=way == "prepacked") for way in WAYS}
    report: dict[str, Any] = {
        "host": {"cpu": cpu_model(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                 "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
        "pair": {"target": EMBEDDED_TARGET, "draft": EMBEDDED_DRAFT, "dtype": "float32",
                 "draft_weights": {w: pairs[w][1].model.talon_quant for w in WAYS},
                 "target_weights": {w: getattr(pairs[w][0].model, "talon_quant", "none") for w in WAYS}},
    }
    if not args.skip_forwards:
        sizes = [int(s) for s in args.sizes.split(",")]
        report["target forward, prefix %d" % PREFIX] = forward_times({w: pairs[w][0] for w in WAYS}, sizes, args.reps)
        print(json.dumps(report, indent=1), flush=True)
    report["host check"] = {str(rows): dict(zip(("plain_ms", "prepacked_ms"),
                                                (round(t * 1e3, 2) for t in time_layer(rows))))
                            for rows in CHECK_ROWS}
    if args.per_suite > 0:
        for planner in args.planner.split(","):
            report[f"loop, planner {planner}"] = loop(pairs, args.drafters.split(","), args.per_suite, args.tokens,
                                                      planner)
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
