"""Where a draft forward's time goes in Talon's loop on CUDA graphs: the host's clock per
function (cProfile) over one run, and the readout's parts timed alone.

    python -m experiments.gpu_profile --out-dir OUT            # on a CUDA device, the 7B preset's shapes
    python -m experiments.gpu_profile --out-dir OUT --tiny     # anywhere: tiny shapes, the static forward

On graphs a draft forward is a bucket's replay plus what the host does around it: the buffers'
fill, the readout (softmax, top-k, the copy back), the tree's bookkeeping. The replay's GPU time
shows as the wait inside the copy back; everything else is host time the GPU idles through.
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import io
import json
import pstats
import sys
import time
from pathlib import Path
from typing import Any

import torch

from talon.engine.engine import Engine, generate
from talon.gpucheck.pairs import BF16, pair_specs, prompt_ids, random_ids, random_model
from talon.graphs.static import StaticForward
from talon.run_config import RunConfig, TreeConfig

PREFIX = 256
RUNS = (("model", "chain", "random"), ("hybrid", "adaptive", "chain"))  # (drafter, tree, prompt)
WATCH = ("expand", "_logits", "forward", "fill", "replay", "prefill", "tolist", "softmax", "topk",
         "build_tree", "_admit", "_keep_best_layer", "_gate_layer", "node_probs", "worth_layer", "verify",
         "judge", "commit", "_keep", "keep", "embeddable_ids", "path_key", "_step", "draft")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, reps: int = 30) -> tuple[float, float]:  # noqa: ANN001
    """Best and median seconds of ``reps`` calls, each synchronised (a loop pays the median)."""
    times = []
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return min(times), sorted(times)[len(times) // 2]


def readout_parts(model: torch.nn.Module, device: torch.device, k: int = 8) -> dict[str, float]:
    """ms of a 1-node draft forward's parts on a graphed static forward: fill + replay; + softmax
    and top-k outside the forward, copied back as two lists (the drafter before the in-forward
    readout); the in-forward readout and its one copy back (``StaticForward.top``, where the
    tree has it)."""
    drafts = "drafts" in inspect.signature(StaticForward).parameters
    sf = StaticForward(model, max_len=PREFIX + 64, buckets=(1, 8), graphs=device.type == "cuda",
                       **({"drafts": True} if drafts else {}))
    sf.prefill(torch.randint(0, 1000, (PREFIX,)))
    ids, pos, vis = torch.tensor([5]), torch.tensor([PREFIX]), torch.ones(1, 1, dtype=torch.bool)
    sf.forward(ids, pos, vis, PREFIX)

    def replay() -> torch.Tensor:
        return sf.forward(ids, pos, vis, PREFIX)

    def outside() -> None:
        q, t = torch.softmax(replay(), dim=-1).topk(k, dim=-1)
        q.tolist(), t.tolist()

    def fill_only() -> None:
        sf.fill(ids, pos, vis, PREFIX)

    parts = [("fill", fill_only), ("fill+replay", replay), ("+softmax+topk+two tolist", outside)]
    if hasattr(sf, "top"):
        parts.append(("top (readout in the forward, one copy)", lambda: sf.top(ids, pos, vis, PREFIX, k)))
    return {name: [round(1e3 * x, 4) for x in timed(fn, device)] for name, fn in parts}  # [best, median]


def profile_run(engine: Engine, prompt: list[int], drafter: str, mode: str, tokens: int,
                plain: bool = False) -> dict[str, Any]:
    """One run after a warm one, under cProfile (``plain``: without it, which adds about 1 us a
    Python call, so the loop's own clock is the figure to quote)."""
    cfg = RunConfig(drafter=drafter, max_new_tokens=tokens, chat_template=False, draft_vocab=0,
                    tree=TreeConfig(mode=mode, cost_aware=False))
    generate(engine, prompt, cfg)  # warm: captures
    prof = cProfile.Profile()
    if not plain:
        prof.enable()
    summary, steps = generate(engine, prompt, cfg)
    prof.disable()
    if plain:
        n = max(len(steps), 1)
        return {"ms_per_step": round(1e3 * summary.seconds / n, 3),
                "split_ms": {k: round(1e3 * sum(getattr(s, f"{k}_s") for s in steps) / n, 3)
                             for k in ("draft", "verify", "other")}}
    n = max(len(steps), 1)
    forwards = sum(s.draft_forwards for s in steps)
    stats = pstats.Stats(prof)
    per_step = {}
    for (path, _, func), (_, calls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        if func in WATCH or any(w in func for w in ("tolist", "replay", "softmax", "topk", "item")):
            key = f"{Path(path).name}:{func}"
            per_step[key] = {"calls_per_step": round(calls / n, 2), "tot_ms": round(1e3 * tottime / n, 3),
                             "cum_ms": round(1e3 * cumtime / n, 3)}
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(60)
    return {"steps": len(steps), "mat": round(summary.mean_accepted_tokens, 2),
            "ms_per_step": round(1e3 * summary.seconds / n, 3), "draft_forwards_per_step": round(forwards / n, 2),
            "split_ms": {k: round(1e3 * sum(getattr(s, f"{k}_s") for s in steps) / n, 3)
                         for k in ("draft", "verify", "other")},
            "per_step": dict(sorted(per_step.items(), key=lambda kv: -kv[1]["cum_ms"])), "cprofile": text.getvalue()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--pair", default="qwen2.5-7b")
    p.add_argument("--tiny", action="store_true", help="tiny shapes, on whatever device there is")
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--plain", action="store_true", help="the loop's own clock, without cProfile")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = BF16 if device.type == "cuda" else torch.float32
    spec = pair_specs(args.tiny, {args.pair})[0]
    target = random_model(spec.target, spec.family, 1, dtype, device, chain_vocab=spec.draft.vocab)
    draft = random_model(spec.draft, spec.family, 2, dtype, device, chain_vocab=spec.draft.vocab, untie=False)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                              "torch": torch.__version__, "pair": args.pair, "dtype": str(dtype)}
    report["readout_ms"] = readout_parts(draft.model, device)
    print("readout", report["readout_ms"], flush=True)
    engine = Engine(target, draft, forward="graphs" if device.type == "cuda" else "static")
    prompts = {"chain": prompt_ids(spec.draft.vocab, PREFIX, 5), "random": random_ids(spec.draft.vocab, PREFIX, 5)}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for drafter, mode, which in RUNS:
        key = f"{drafter}/{mode}/{which}"
        record = profile_run(engine, prompts[which], drafter, mode, args.tokens, args.plain)
        if not args.plain:
            (args.out_dir / f"profile-{drafter}-{mode}.txt").write_text(record.pop("cprofile"))
        report[key] = record
        print(key, {k: v for k, v in record.items() if k != "per_step"}, flush=True)
        for name, row in list(record.get("per_step", {}).items())[:28]:
            print(f"  {name:48s} {row}", flush=True)
    (args.out_dir / "profile.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
