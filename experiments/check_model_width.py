"""Do the GPU check's models accept drafts, and catch a planted bug, at a preset's real width?

The GPU check runs a preset's real shapes, which do not fit a CPU in float32; its depth is proven
on the CPU by ``tests/test_full_depth.py`` (a narrow MLP and vocabulary). This builds the
preset's real width, heads and vocabulary with only ``--layers`` layers, runs the draft model's
trees against ``generate()`` and then each planted bug (``check_model.PLANTS``), and prints one
JSON report. ``--unscaled`` builds the models without the reference scaling of
``check_model.condition`` (the MLP width, the head's random part, a narrow model's branches), as
the check built them before 2026-11-27.

    python -m experiments.check_model_width              # about 2 minutes on 2 cores
    python -m experiments.check_model_width --unscaled   # about 4

Figures: docs/runs/2026-11-27-check-model-width.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch

from talon.engine.engine import Engine, generate
from talon.gpucheck import check_model
from talon.gpucheck.pair_checks import greedy_cfg, plain
from talon.gpucheck.pairs import F32, pair_specs, random_ids, random_model, reference

CONFIGS = (("model", "adaptive"), ("hybrid", "static"), ("model", "chain"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", default="qwen2.5-7b")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--unscaled", action="store_true")
    args = p.parse_args(argv)
    if args.unscaled:
        check_model.REFERENCE_MLP = check_model.REFERENCE_VOCAB = 10**9
        check_model.REFERENCE_HIDDEN = 0
    spec = pair_specs(False, {args.pair})[0]
    start, cpu = time.perf_counter(), torch.device("cpu")
    target, draft = (random_model(dataclasses.replace(shape, layers=args.layers), spec.family, seed, F32, cpu,
                                  chain_vocab=spec.draft.vocab) for shape, seed in ((spec.target, 1), (spec.draft, 2)))
    ids = random_ids(spec.draft.vocab, 48, 3)
    gate = check_model.conditioning(target.model, ids)
    engine, want = Engine(target, draft), reference(target, ids, args.tokens)
    report: dict = {"pair": args.pair, "layers": args.layers, "scaled": not args.unscaled,
                    "target": dataclasses.asdict(dataclasses.replace(spec.target, layers=args.layers)),
                    "gate": gate.as_detail(), "mat": {}, "lossless": {}, "planted_caught": {}}
    for drafter, mode in CONFIGS:
        summary, _ = generate(engine, ids, greedy_cfg(drafter, args.tokens, tree=plain(mode)))
        report["mat"][f"{drafter}/{mode}"] = round(summary.mean_accepted_tokens, 2)
        report["lossless"][f"{drafter}/{mode}"] = summary.token_ids == want
    for bug in check_model.PLANTS:
        with check_model.planted(bug):
            report["planted_caught"][bug] = any(
                generate(engine, ids, greedy_cfg(d, args.tokens, tree=plain(m)))[0].token_ids != want
                for d, m in CONFIGS)
    report["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
