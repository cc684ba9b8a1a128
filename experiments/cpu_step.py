"""The static forward on the CPU: is it, or ``torch.compile`` (inductor) over it, faster than the
dynamic cache the CPU runs by default? On the embedded pair, with nothing else on the cores.

    python -m experiments.cpu_step --out docs/cpu_step.json            # forwards, then the loop
    python -m experiments.cpu_step --no-compile --prompts 2             # quicker

Measures (best of ``--reps``, after a warm-up):
* one draft forward of 1 and 4 tokens and one target verification of 1, 16 and 64 tokens after a
  256-token prefix: the dynamic cache (``talon.core.forward.forward_hidden`` and the head), the eager
  static forward (``talon.graphs.static.StaticForward``), and the static forward compiled by inductor
  (draft only: compile time reported);
* the loop (``none`` and ``hybrid``) on Spec-Bench prompts, one of each of the first suites,
  ``Engine(forward="dynamic")`` against ``Engine(forward="static")``: tok/s and the step split.
Prints one JSON report (also ``--out``).
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
from transformers import DynamicCache

from talon.core.forward import forward_hidden
from talon.engine.engine import Engine, generate
from talon.graphs.static import StaticForward
from talon.models import EMBEDDED_DRAFT, EMBEDDED_TARGET, load_pair
from talon.models.device import hardware_name
from talon.models.head import lm_logits
from talon.run_config import RunConfig
from talon.specbench import SPECBENCH_SUITES, default_data_dir, load_prompts

PREFIX = 256
VOCAB = RunConfig().draft_vocab  # the draft head's width a run uses by default


def best(fn, reps: int) -> float:  # noqa: ANN001
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def dynamic_ms(model, sizes: list[int], reps: int) -> dict[int, float]:  # noqa: ANN001
    cache = DynamicCache(config=model.config)
    ids = torch.randint(0, 1000, (PREFIX + max(sizes),))
    forward_hidden(model, cache, ids[:PREFIX], torch.arange(PREFIX), None)
    out = {}
    for size in sizes:
        def once() -> None:
            hidden = forward_hidden(model, cache, ids[PREFIX:PREFIX + size], torch.arange(PREFIX, PREFIX + size), None)
            lm_logits(model, hidden, VOCAB if model.talon_draft else 0).argmax(-1)
            cache.crop(-size)
        out[size] = round(1e3 * best(once, reps), 2)
    return out


def static_ms(model, sizes: list[int], reps: int) -> dict[int, float]:  # noqa: ANN001
    sf = StaticForward(model, max_len=PREFIX + 512, buckets=tuple(sorted(set(sizes) | {64})))
    ids = torch.randint(0, 1000, (PREFIX + max(sizes),))
    sf.prefill(ids[:PREFIX])
    out = {}
    for size in sizes:
        causal = torch.ones(size, size, dtype=torch.bool).tril()
        once = lambda: sf.forward(ids[PREFIX:PREFIX + size], torch.arange(PREFIX, PREFIX + size),  # noqa: E731
                                  causal, PREFIX).argmax(-1)
        out[size] = round(1e3 * best(once, reps), 2)
    return out


def compiled_ms(model, sizes: list[int], reps: int) -> dict[str, Any]:  # noqa: ANN001
    """The static forward with the model compiled by inductor (one compile per bucket shape)."""
    compiled = torch.compile(model, dynamic=False)
    sf = StaticForward(model, max_len=PREFIX + 512, buckets=tuple(sorted(set(sizes) | {64})))
    sf.model = compiled
    ids = torch.randint(0, 1000, (PREFIX + max(sizes),))
    start = time.perf_counter()
    sf.prefill(ids[:PREFIX])  # compiles the prefill's bucket too
    out: dict[str, Any] = {"compile_s": {}}
    out["compile_s"]["prefill"] = round(time.perf_counter() - start, 1)
    for size in sizes:
        causal = torch.ones(size, size, dtype=torch.bool).tril()
        once = lambda: sf.forward(ids[PREFIX:PREFIX + size], torch.arange(PREFIX, PREFIX + size),  # noqa: E731
                                  causal, PREFIX).argmax(-1)
        start = time.perf_counter()
        once()
        out["compile_s"][size] = round(time.perf_counter() - start, 1)
        out[size] = round(1e3 * best(once, reps), 2)
    return out


def loop(target, draft, prompts: list[str], tokens: int) -> dict[str, Any]:  # noqa: ANN001
    out: dict[str, Any] = {}
    for step in ("dynamic", "static"):
        engine = Engine(target, draft, forward=step)
        for drafter in ("none", "hybrid"):
            cfg = RunConfig(drafter=drafter, max_new_tokens=tokens)
            generate(engine, prompts[0], cfg)  # warm (the cost probe, the static forwards)
            seconds, new, split, ids = 0.0, 0, {"draft": 0.0, "verify": 0.0, "other": 0.0}, []
            for prompt in prompts:
                summary, steps = generate(engine, prompt, cfg)
                seconds += summary.seconds
                new += len(summary.token_ids)
                ids.append(summary.token_ids)
                for k in split:
                    split[k] += sum(getattr(s, f"{k}_s") for s in steps)
            out[f"{step}/{drafter}"] = {"tok_s": round(new / seconds, 2), "tokens": new,
                                        "split_s": {k: round(v, 2) for k, v in split.items()}, "ids": ids}
    for drafter in ("none", "hybrid"):
        out[f"same_tokens/{drafter}"] = out[f"dynamic/{drafter}"].pop("ids") == out[f"static/{drafter}"].pop("ids")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=6, help="Spec-Bench prompts for the loop, one per suite")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--no-loop", action="store_true")
    p.add_argument("--draft-quant", default="auto", help="auto (int8 on this CPU), none: the draft in float32/bf16")
    args = p.parse_args(argv)
    target, draft = load_pair(EMBEDDED_TARGET, EMBEDDED_DRAFT, "auto", draft_quant=args.draft_quant)
    target.model.talon_draft, draft.model.talon_draft = False, True
    report: dict[str, Any] = {"cpu": hardware_name(target.device), "machine": platform.machine(),
                              "draft_quant": getattr(draft.model, "talon_quant", "none"), "draft_vocab": VOCAB,
                              "threads": torch.get_num_threads(), "dtype": str(target.dtype),
                              "torch": torch.__version__,
                              "prefix": PREFIX}
    with torch.inference_mode():
        report["draft_ms"] = {"dynamic": dynamic_ms(draft.model, [1, 4], args.reps),
                              "static": static_ms(draft.model, [1, 4], args.reps)}
        report["verify_ms"] = {"dynamic": dynamic_ms(target.model, [1, 16, 64], args.reps),
                               "static": static_ms(target.model, [1, 16, 64], args.reps)}
        print(json.dumps(report), flush=True)
        if not args.no_compile:
            try:
                report["draft_ms"]["static_compiled"] = compiled_ms(draft.model, [1, 4], args.reps)
            except Exception as err:  # noqa: BLE001 - a compile failure is a finding, reported
                report["draft_ms"]["static_compiled"] = {"error": f"{type(err).__name__}: {str(err)[:400]}"}
            print(json.dumps(report["draft_ms"]), flush=True)
    if not args.no_loop:
        suites = list(SPECBENCH_SUITES)[: args.prompts]
        prompts = [p.text for p in load_prompts(default_data_dir(), suites, limit=1)]
        report["loop"] = loop(target, draft, prompts, args.tokens)
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
