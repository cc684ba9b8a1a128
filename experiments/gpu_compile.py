"""Manual CUDA-graph capture of the eager static forward against the same capture of a
``torch.compile``d (inductor) decoder, at a preset's real shapes (random weights, bf16): replay
time per bucket, compile seconds, and the logits' difference. Answers the speed issue's "measure
and choose" on a GPU (the CPU's figures are in docs/gpu.md).

    python -m experiments.gpu_compile --pair qwen2.5-7b --draft-sizes 1,8 --target-sizes 1
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from talon.engine.engine import Engine, generate
from talon.gpucheck.pairs import BF16, pair_specs, random_ids, random_model
from talon.gpucheck.speed import PREFIX, bucket_times, step_split
from talon.graphs.static import StaticForward
from talon.run_config import RunConfig, TreeConfig


def compare(model: torch.nn.Module, sizes: list[int]) -> dict[str, Any]:
    """Graph replay ms per bucket, eager decoder against compiled, and what compiling cost."""
    out: dict[str, Any] = {}
    prompt = torch.randint(0, 1000, (PREFIX,))
    ids, pos = torch.tensor([5]), torch.tensor([PREFIX])
    one = torch.ones(1, 1, dtype=torch.bool)
    logits = {}
    for label, compiled in (("eager_graph", False), ("compiled_graph", True)):
        buckets = tuple(sorted(set(sizes)))
        sf = StaticForward(model, max_len=PREFIX + max(buckets) + 8, buckets=buckets, graphs=True,
                           compile_upto=max(buckets) if compiled else 0)
        start = time.perf_counter()
        sf.prefill(prompt)  # compiles (and captures) the largest bucket
        logits[label] = sf.forward(ids, pos, one, PREFIX).float().clone()  # the 1-bucket
        torch.cuda.synchronize()
        first_s = time.perf_counter() - start
        ms = {n: round(1e3 * s, 3) for n, s in bucket_times(sf, buckets).items()}
        out[label] = {"ms": ms, "first_use_s": round(first_s, 1),
                      "capture_s": round(sf.capture_report.seconds, 1)}
        print(label, out[label], flush=True)
        del sf
        torch.cuda.empty_cache()
    out["max_logit_diff"] = round(float((logits["eager_graph"] - logits["compiled_graph"]).abs().max()), 4)
    out["same_argmax"] = bool((logits["eager_graph"].argmax(-1) == logits["compiled_graph"].argmax(-1)).all())
    return out


def loop(spec, tokens: int) -> dict[str, Any]:  # noqa: ANN001 - PairSpec
    """Talon's loop, drafter ``model`` with chain trees (every draft forward a bucket of 1, so
    the compiled step compiles once), on ``graphs`` and on ``compiled``: ms a step, its split,
    and whether both produced the same tokens (the same verifier; only the drafts differ)."""
    device = torch.device("cuda")
    target = random_model(spec.target, spec.family, 1, BF16, device, chain_vocab=spec.draft.vocab)
    draft = random_model(spec.draft, spec.family, 2, BF16, device, chain_vocab=spec.draft.vocab, untie=False)
    prompt = random_ids(spec.draft.vocab, PREFIX, 5)
    out: dict[str, Any] = {}
    made = {}
    for step in ("graphs", "compiled"):
        engine = Engine(target, draft, forward=step)
        cfg = RunConfig(drafter="model", max_new_tokens=tokens, chat_template=False, draft_vocab=0,
                        tree=TreeConfig(mode="chain", cost_aware=False))
        start = time.perf_counter()
        generate(engine, prompt, cfg)  # the first run captures (and compiles) its buckets
        first_s = time.perf_counter() - start
        summary, steps = generate(engine, prompt, cfg)
        made[step] = summary.token_ids
        out[step] = {"ms_per_step": round(1e3 * summary.seconds / max(len(steps), 1), 3),
                     "split_ms": step_split(steps), "mat": round(summary.mean_accepted_tokens, 2),
                     "draft_forwards_per_step": round(sum(s.draft_forwards for s in steps) / max(len(steps), 1), 2),
                     "first_run_s": round(first_s, 1)}
        print(step, out[step], flush=True)
        del engine
    out["same_tokens"] = made["graphs"] == made["compiled"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", default="qwen2.5-7b")
    p.add_argument("--draft-sizes", default="1,8")
    p.add_argument("--target-sizes", default="1", help="empty: skip the target")
    p.add_argument("--loop", type=int, default=0,
                   help="also time Talon's loop for this many tokens, graphs against compiled")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this compares CUDA graphs", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    spec = pair_specs(False, {args.pair})[0]
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__,
                              "pair": args.pair, "dtype": "bfloat16", "prefix": PREFIX}
    sizes = {"draft": args.draft_sizes, "target": args.target_sizes}
    for role, shape, seed in (("draft", spec.draft, 2), ("target", spec.target, 1)):
        wanted = [int(s) for s in sizes[role].split(",") if s]
        if not wanted:
            continue
        lm = random_model(shape, spec.family, seed, BF16, device, chain_vocab=spec.draft.vocab, untie=role == "target")
        report[role] = compare(lm.model, wanted)
        del lm
        torch.cuda.empty_cache()
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))
    if args.loop:
        report["loop"] = loop(spec, args.loop)
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
