"""How each target weight mode relates to the float32 dequantized GGUF target, and what it is
worth in speed, on the embedded pair.

    python -m experiments.target_weights_check [--per-suite 2] [--tokens 64] [--start 20]

Numerics: the float32 target writes ``--tokens`` greedy tokens for each prompt (Spec-Bench
prompts from ``--start`` on, which the reported benchmark does not use); the text is then
teacher-forced through every mode, and at each position the mode's argmax is compared with
float32's (top-1 agreement), with the largest float32 logit gap where they disagree. Speed: plain
decoding (``ar``) and Talon's default, tokens/s, per mode on the same prompts, one process, the
modes interleaved per prompt. Prints one JSON object and a table.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys

import torch

from talon.engine.engine import Engine, generate
from talon.engine.prompt import encode_prompt
from talon.models import LoadedModel, cpu_model, load_pair
from talon.models.embedded import EMBEDDED_DRAFT, EMBEDDED_TARGET
from talon.models.head import head_rows
from talon.models.loading import shipped_blocks
from talon.models.quant import quantize_target
from talon.run_config import RunConfig
from talon.specbench import SPECBENCH_SUITES, default_data_dir, load_prompts

MODES = ("float32", "bf16", "int8", "int4", "int4-rtn")  # int4-rtn: rounded, not the Q4_K blocks


def variant(f32: LoadedModel, mode: str) -> LoadedModel:
    if mode == "float32":
        return f32
    copied = LoadedModel(copy.deepcopy(f32.model), f32.tokenizer, f32.name, torch.float32, f32.device)
    if mode == "bf16":
        copied.model.to(torch.bfloat16)
        return LoadedModel(copied.model, f32.tokenizer, f32.name, torch.bfloat16, f32.device)
    if mode == "int4-rtn":
        return quantize_target(copied, "int4")
    return quantize_target(copied, mode, blocks=shipped_blocks(f32.name, None) if mode == "int4" else None)


@torch.inference_mode()
def logits_over(lm: LoadedModel, ids: list[int], start: int) -> torch.Tensor:
    out = lm.model(torch.tensor([ids]), use_cache=False)
    return out.logits[0, start - 1 : len(ids) - 1].float()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--per-suite", type=int, default=2)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--start", type=int, default=20)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--no-speed", action="store_true", help="numerics only (no ar / talon runs)")
    a = p.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    prompts = load_prompts(default_data_dir(), SPECBENCH_SUITES, a.per_suite, a.start)
    f32, draft = load_pair(EMBEDDED_TARGET, EMBEDDED_DRAFT, "float32", "cpu", draft_quant="auto")
    targets = {m: variant(f32, m) for m in modes}
    engines = {m: Engine(t, draft) for m, t in targets.items()}
    vocab = head_rows(f32.model)
    agree = {m: [0, 0] for m in modes}
    worst_gap = {m: 0.0 for m in modes}
    speed = {m: {"ar": [0, 0.0], "talon": [0, 0.0]} for m in modes}
    for prompt in prompts:
        ids = encode_prompt(f32.tokenizer, prompt.text[:4000], True, vocab)
        ref, _ = generate(engines["float32"], ids, RunConfig(drafter="hybrid", max_new_tokens=a.tokens))
        full = ids + ref.token_ids
        base = logits_over(f32, full, len(ids))
        for m in modes:
            got = logits_over(targets[m], full, len(ids)) if m != "float32" else base
            top_ref, top_got = base.argmax(-1), got.argmax(-1)
            same = top_ref == top_got
            agree[m][0] += int(same.sum())
            agree[m][1] += len(same)
            for i in (~same).nonzero().flatten().tolist():
                gap = float(base[i, top_ref[i]] - base[i, top_got[i]])
                worst_gap[m] = max(worst_gap[m], gap)
            for method, drafter in () if a.no_speed else (("ar", "none"), ("talon", "hybrid")):
                s, _ = generate(engines[m], ids,
                                RunConfig(drafter=drafter, max_new_tokens=a.tokens, cost_model="fixed"))
                speed[m][method][0] += len(s.token_ids)
                speed[m][method][1] += s.seconds
        print(f"{prompt.suite}-{prompt.index} done", file=sys.stderr, flush=True)
    report = {
        "host": cpu_model(), "threads": torch.get_num_threads(),
        "prompts": len(prompts), "tokens": a.tokens,
        "modes": {m: {"top1_agreement": agree[m][0] / max(agree[m][1], 1), "positions": agree[m][1],
                      "largest_gap_on_disagreement": round(worst_gap[m], 4),
                      "ar_tok_s": _rate(speed[m]["ar"]), "talon_tok_s": _rate(speed[m]["talon"])} for m in modes},
    }
    print(json.dumps(report))
    bf16_ar = report["modes"].get("bf16", {}).get("ar_tok_s")
    print("| weights | top-1 vs float32 | largest gap | ar tok/s | talon tok/s | ar vs bf16 ar |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for m, r in report["modes"].items():
        ratio = f"{r['ar_tok_s'] / bf16_ar:.2f}x" if bf16_ar and r["ar_tok_s"] else "n/a"
        print(f"| {m} | {100 * r['top1_agreement']:.2f} % | {r['largest_gap_on_disagreement']:.3f} | "
              f"{r['ar_tok_s'] or 0:.2f} | {r['talon_tok_s'] or 0:.2f} | {ratio} |")
    return 0


def _rate(tokens_seconds: list) -> float | None:
    return tokens_seconds[0] / tokens_seconds[1] if tokens_seconds[1] else None


if __name__ == "__main__":
    sys.exit(main())
