"""Grouped-query attention folded (``talon.attention``) against transformers' ``repeat_kv``, in
the static forward: the same logits, and what the copy of the keys and values costs.

    python scripts/gqa_fold.py --embedded --out docs/gpu_runs/cpu-gqa-fold.json   # the CPU pair
    python scripts/gqa_fold.py --pair qwen2.5-7b --out DIR/fold.json              # CUDA, random weights
    python scripts/gqa_fold.py --tiny                                             # anywhere, seconds

For each model and slot-cache length (``--lens``; the engine's pools hold 1024 slots a quantum,
4096 on the ``compiled`` step) it prefills ``PREFIX`` tokens, then times one step of each size
(``--sizes``; best of ``--reps``) folded and with the keys and values repeated, the step filled,
run and its argmax read. On CUDA each variant is captured as a graph and replayed (``--eager``
to time the eager forward instead). Prints one JSON report (also ``--out``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from talon.models.device import hardware_name  # noqa: E402
from talon.static import StaticForward  # noqa: E402

PREFIX = 256


def best_s(fn, reps: int, cuda: bool) -> float:  # noqa: ANN001
    fn()
    times = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(model, max_len: int, sizes: list[int], reps: int, graphs: bool) -> dict[str, Any]:  # noqa: ANN001
    """Both variants of one model at one cache length: ms a step and the logits' difference."""
    cuda = model.device.type == "cuda"
    buckets = tuple(sorted(set(sizes)))
    ids = torch.randint(1, 1000, (PREFIX + max(sizes),))
    out: dict[str, Any] = {}
    logits: dict[str, dict[int, torch.Tensor]] = {}
    for variant in ("repeat", "folded"):
        sf = StaticForward(model, max_len=max_len, buckets=buckets, graphs=graphs)
        if variant == "repeat":
            sf.fold = {}
        sf.prefill(ids[:PREFIX])
        logits[variant] = {}
        for size in sizes:
            args = (ids[PREFIX:PREFIX + size], torch.arange(PREFIX, PREFIX + size),
                    torch.ones(size, size, dtype=torch.bool).tril(), PREFIX)
            logits[variant][size] = sf.forward(*args).float().clone()
            out.setdefault(variant, {})[size] = round(1e3 * best_s(lambda: sf.forward(*args).argmax(-1).tolist(),
                                                                    reps, cuda), 3)
        del sf
        if cuda:
            torch.cuda.empty_cache()
    out["max_logit_diff"] = {s: round(float((logits["folded"][s] - logits["repeat"][s]).abs().max()), 5) for s in sizes}
    out["same_argmax"] = all(bool((logits["folded"][s].argmax(-1) == logits["repeat"][s].argmax(-1)).all())
                             for s in sizes)
    out["folded/repeat"] = {s: round(out["folded"][s] / out["repeat"][s], 3) for s in sizes}
    return out


def models(args: argparse.Namespace) -> list[tuple[str, Any]]:
    if args.embedded:
        from talon.models import EMBEDDED_DRAFT, EMBEDDED_TARGET, load_pair
        target, draft = load_pair(EMBEDDED_TARGET, EMBEDDED_DRAFT)
        return [("target", target.model), ("draft", draft.model)]
    from gpu_pairs import BF16, F32, pair_specs, random_model
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
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    sizes = [int(s) for s in args.sizes.split(",")]
    report: dict[str, Any] = {"host": hardware_name(torch.device("cuda" if torch.cuda.is_available() else "cpu")), "python": platform.python_version(), "torch": torch.__version__,
                              "prefix": PREFIX, "reps": args.reps}
    with torch.inference_mode():
        for role, model in models(args):
            graphs = model.device.type == "cuda" and not args.eager
            heads = (model.config.num_attention_heads, model.config.num_key_value_heads)
            report[role] = {"dtype": str(model.dtype), "heads/kv": f"{heads[0]}/{heads[1]}",
                            "layers": model.config.num_hidden_layers, "graphs": graphs}
            for length in (int(x) for x in args.lens.split(",")):
                report[role][f"L={length}"] = measure(model, length, sizes, args.reps, graphs)
                print(role, length, report[role][f"L={length}"], flush=True)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
