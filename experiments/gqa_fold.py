"""Grouped-query attention folded (``talon.models.attention``) against transformers' ``repeat_kv``, in
the static forward: the same logits, and what the copy of the keys and values costs.

    python -m experiments.gqa_fold --embedded --out docs/gpu_runs/cpu-gqa-fold.json   # the CPU pair
    python -m experiments.gqa_fold --pair qwen2.5-7b --out DIR/fold.json              # CUDA, random weights
    python -m experiments.gqa_fold --tiny                                             # anywhere, seconds
    python -m experiments.gqa_fold --embedded --loop 2 --out FILE   # + the loop, 2 prompts a suite

For each model and slot-cache length (``--lens``; the engine's pools hold 1024 slots a quantum,
4096 on the ``compiled`` step) it prefills ``PREFIX`` tokens, then times one step of each size
(``--sizes``; best of ``--reps``, the two in turn) folded and with the keys and values
repeated, the step filled, run and its argmax read. On CUDA each variant is captured as a graph
and replayed (``--eager`` to time the eager forward instead). ``--loop N`` then runs the hybrid
drafter on the pair (the engine's default step) over ``N`` Spec-Bench prompts of every suite,
each prompt both ways in turn (``talon.models.attention.set_fold`` on both models, read by every
forward on the dynamic cache), and reports tok/s, where the time went and whether the tokens
were the same. Prints one JSON report (also ``--out``).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from scripts.report import emit
from talon.graphs.static import StaticForward
from talon.models.attention import set_fold
from talon.models.device import hardware_name

PREFIX = 256


def measure(model, max_len: int, sizes: list[int], reps: int, graphs: bool) -> dict[str, Any]:  # noqa: ANN001
    """Both variants of one model at one cache length, timed in turn (so that a noisy spell of
    the host hits both): ms a step (best of ``reps``) and the logits' largest difference."""
    cuda = model.device.type == "cuda"
    set_fold(model, True)  # the folded forward passes the flag; the other is told not to
    ids = torch.randint(1, 1000, (PREFIX + max(sizes),))
    forwards = {}
    for variant in ("repeat", "folded"):
        forwards[variant] = sf = StaticForward(model, max_len=max_len, buckets=tuple(sorted(set(sizes))), graphs=graphs)
        if variant == "repeat":
            sf.fold = {}
        sf.prefill(ids[:PREFIX])
    out: dict[str, Any] = {"repeat": {}, "folded": {}, "max_logit_diff": {}, "same_argmax": True}
    for size in sizes:
        args = (ids[PREFIX:PREFIX + size], torch.arange(PREFIX, PREFIX + size),
                torch.ones(size, size, dtype=torch.bool).tril(), PREFIX)
        logits = {v: sf.forward(*args).float().clone() for v, sf in forwards.items()}  # (a capture, under graphs)
        out["max_logit_diff"][size] = round(float((logits["folded"] - logits["repeat"]).abs().max()), 5)
        out["same_argmax"] &= bool((logits["folded"].argmax(-1) == logits["repeat"].argmax(-1)).all())
        times: dict[str, list[float]] = {v: [] for v in forwards}
        for _ in range(reps):
            for variant, sf in forwards.items():
                if cuda:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                sf.forward(*args).argmax(-1).tolist()
                times[variant].append(time.perf_counter() - start)
        for variant in forwards:
            out[variant][size] = round(1e3 * min(times[variant]), 3)
    del forwards
    if cuda:
        torch.cuda.empty_cache()
    out["folded/repeat"] = {s: round(out["folded"][s] / out["repeat"][s], 3) for s in sizes}
    return out


def loop(pair, per_suite: int, tokens: int) -> dict[str, Any]:  # noqa: ANN001
    """The hybrid drafter on ``per_suite`` prompts of each Spec-Bench suite, folded and not in turn."""
    from talon.engine.engine import Engine, generate
    from talon.run_config import RunConfig
    from talon.specbench import SPECBENCH_SUITES, default_data_dir, load_prompts

    engine, cfg = Engine(*pair), RunConfig(drafter="hybrid", max_new_tokens=tokens)
    prompts = load_prompts(default_data_dir(), SPECBENCH_SUITES, limit=per_suite)
    generate(engine, prompts[0].text, cfg)  # warm: the cost probe
    totals = {v: {"seconds": 0.0, "tokens": 0, "draft_s": 0.0, "verify_s": 0.0, "other_s": 0.0}
              for v in ("repeat", "folded")}
    same, suites = True, {}
    for i, prompt in enumerate(prompts):
        ids = {}
        for variant in (("repeat", "folded") if i % 2 == 0 else ("folded", "repeat")):
            for lm in pair:
                set_fold(lm.model, variant == "folded")
            summary, _ = generate(engine, prompt.text, cfg)
            ids[variant] = summary.token_ids
            t = totals[variant]
            t["seconds"] += summary.seconds
            t["tokens"] += len(summary.token_ids)
            for k in ("draft_s", "verify_s", "other_s"):
                t[k] += getattr(summary, k)
            suites.setdefault(prompt.suite, {}).setdefault(variant, 0.0)
            suites[prompt.suite][variant] += summary.seconds
        same &= ids["repeat"] == ids["folded"]
        print(prompt.suite, prompt.index, {v: round(suites[prompt.suite][v], 1) for v in ids}, flush=True)
    out: dict[str, Any] = {v: {"tok_s": round(t["tokens"] / t["seconds"], 3), **{k: round(x, 2) for k, x in t.items()}}
                           for v, t in totals.items()}
    out["folded/repeat seconds"] = round(totals["folded"]["seconds"] / totals["repeat"]["seconds"], 3)
    out["by suite, folded/repeat seconds"] = {s: round(v["folded"] / v["repeat"], 3) for s, v in suites.items()}
    out["same_tokens"], out["prompts"], out["tokens_each"] = same, len(prompts), tokens
    return out


def models(args: argparse.Namespace) -> list[tuple[str, Any]]:
    if args.embedded:
        from talon.models import EMBEDDED_DRAFT, EMBEDDED_TARGET, load_pair
        target, draft = load_pair(EMBEDDED_TARGET, EMBEDDED_DRAFT)
        args.pair_loaded = (target, draft)
        return [("target", target.model), ("draft", draft.model)]
    from talon.gpucheck.pairs import BF16, F32, pair_specs, random_model
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = BF16 if device.type == "cuda" else F32
    spec = pair_specs(args.tiny, {args.pair})[0]
    return [(role, random_model(shape, spec.family, seed, dtype, device, init="conditioned").model)
            for role, shape, seed in (("target", spec.target, 1), ("draft", spec.draft, 2))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedded", action="store_true", help="the embedded CPU pair (converted in ~/.cache/talon)")
    parser.add_argument("--pair", default="qwen2.5-7b", help="a GPU preset's shapes, random weights")
    parser.add_argument("--tiny", action="store_true", help="the preset's shapes shrunk (a quick check anywhere)")
    parser.add_argument("--lens", default="1024,4096", help="slot-cache lengths")
    parser.add_argument("--sizes", default="1,8,64", help="step sizes (nodes)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--eager", action="store_true", help="on CUDA, time the eager forward, not a graph replay")
    parser.add_argument("--loop", type=int, default=0, metavar="N",
                        help="then the loop (--embedded): N prompts a suite")
    parser.add_argument("--tokens", type=int, default=48, help="new tokens a prompt in the loop")
    parser.add_argument("--skip-forwards", action="store_true", help="the loop only")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.loop and not args.embedded:
        parser.error("--loop runs the embedded pair (--embedded): random weights accept nothing")
    torch.manual_seed(0)
    sizes = [int(s) for s in args.sizes.split(",")]
    report: dict[str, Any] = {"host": hardware_name(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
                              "python": platform.python_version(), "torch": torch.__version__,
                              "prefix": PREFIX, "reps": args.reps}
    with torch.inference_mode():
        for role, model in models(args):
            if args.skip_forwards:
                continue
            graphs = model.device.type == "cuda" and not args.eager
            heads = (model.config.num_attention_heads, model.config.num_key_value_heads)
            report[role] = {"dtype": str(model.dtype), "heads/kv": f"{heads[0]}/{heads[1]}",
                            "layers": model.config.num_hidden_layers, "graphs": graphs}
            for length in (int(x) for x in args.lens.split(",")):
                report[role][f"L={length}"] = measure(model, length, sizes, args.reps, graphs)
                print(role, length, report[role][f"L={length}"], flush=True)
    if args.loop:
        report["loop"] = loop(args.pair_loaded, args.loop, args.tokens)
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
