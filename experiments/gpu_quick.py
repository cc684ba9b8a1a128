"""A short device check of the graph loop, for a short call: the preset's
real shapes in float32 (random check models), every drafter on CUDA graphs (the default step
on CUDA), async included, against ``generate()``; each phase under a watchdog that prints every
thread's stack and exits if it hangs.

    python -m experiments.gpu_quick --pair qwen2.5-7b --tokens 48
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import time

import torch

from talon.engine.engine import Engine, generate
from talon.gpucheck.pair_checks import greedy_cfg, plain
from talon.gpucheck.pairs import F32, pair_specs, prompt_ids, random_ids, random_model, reference

RUNS = (("none", "chain", False), ("retrieval", "adaptive", False), ("model", "adaptive", False),
        ("hybrid", "adaptive", False), ("hybrid", "static", False), ("model", "adaptive", True),
        ("hybrid", "adaptive", True))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", default="qwen2.5-7b")
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--watchdog-s", type=float, default=60)
    args = p.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cuda = torch.cuda.is_available()  # elsewhere: the tiny shapes on the eager static forward (a smoke test)
    device = torch.device("cuda" if cuda else "cpu")
    spec = pair_specs(not cuda, {args.pair})[0]
    target = random_model(spec.target, spec.family, 1, F32, device, chain_vocab=spec.draft.vocab)
    draft = random_model(spec.draft, spec.family, 2, F32, device, chain_vocab=spec.draft.vocab)
    prompts = {"chain": prompt_ids(spec.draft.vocab, 48, 3), "random": random_ids(spec.draft.vocab, 48, 3)}
    wants = {k: reference(target, ids, args.tokens) for k, ids in prompts.items()}
    engine = Engine(target, draft, forward="auto" if cuda else "static")
    out: dict = {"forward": engine.forward, "runs": {}}
    for drafter, mode, async_draft in RUNS:
        which = "chain" if drafter == "retrieval" else "random"
        cfg = greedy_cfg(drafter, args.tokens, tree=plain(mode), async_draft=async_draft)
        faulthandler.dump_traceback_later(args.watchdog_s, exit=True)
        start = time.perf_counter()
        summary, steps = generate(engine, prompts[which], cfg)
        faulthandler.cancel_dump_traceback_later()
        key = f"{drafter}/{mode}/{'async' if async_draft else 'sync'}"
        out["runs"][key] = {"same": summary.token_ids == wants[which], "mat": round(summary.mean_accepted_tokens, 2),
                            "s": round(time.perf_counter() - start, 2),
                            "reused": sum(1 for s in steps if s.predraft_reused)}
        print(key, out["runs"][key], flush=True)
    out["ok"] = all(r["same"] for r in out["runs"].values())
    out["pools"] = {role: {"made": pool.made, "free": len(pool.free)} for role, pool in engine.static_pools.items()}
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
