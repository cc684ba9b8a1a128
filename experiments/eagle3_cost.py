"""What does an EAGLE-3 head's draft forward cost against a draft model's, at a preset's real shapes?

Random weights (timing only) in bf16 (float32 with ``--dtype float32``): the Llama-3.1-8B preset's
EAGLE-3 head (h 4096, 32 heads, 8 key/value heads, MLP 14336, a 32k draft vocabulary, the target's
128k embedding) through Talon's own timer (``talon.drafters.pairs.pair_timer``: one layer of
``size`` tree nodes over a 256-pair prefix), beside the preset's 1B draft model (Llama-3.2-1B's
shape) through the cost probe's dynamic-cache timer. Each size is the best of ``--reps`` rounds.

    .venv/bin/python -m experiments.eagle3_cost --out docs/runs/2026-11-27-cpu-eagle3-cost.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

from talon.core.forward import forward_hidden
from talon.core.kv import gather_entries
from talon.cost.probe import hardware_name
from talon.drafters.pairs import pair_timer
from talon.models.eagle3 import Eagle3Head
from talon.models.head import lm_logits
from talon.models.head_config import HeadConfig

PREFIX = 256
DRAFT_VOCAB = 32_768  # the draft_vocab knob's default: a draft model's logits over its first 32k ids
SIZES = (1, 2, 4, 8, 16, 32)


def llama_head(dtype: torch.dtype) -> Eagle3Head:
    cfg = HeadConfig(hidden=4096, target_hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14_336,
                     vocab=128_256, draft_vocab=32_000, rms_eps=1e-5, rope_theta=500_000.0, rope_scaling=None,
                     aux_layers=(2, 16, 29), norm_before_residual=False, layout="eagle")
    embed = torch.nn.Embedding(cfg.vocab, cfg.hidden, dtype=dtype)
    head = Eagle3Head(cfg, embed)
    with torch.no_grad():
        for param in head.parameters():
            param.normal_(0.0, 0.02)
    return head.to(dtype).eval()


def draft_model(dtype: torch.dtype) -> torch.nn.Module:
    """Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 heads, 8 key/value heads, MLP 8192, 128k tied)."""
    config = LlamaConfig(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         intermediate_size=8192, vocab_size=128_256, tie_word_embeddings=True,
                         attn_implementation="sdpa")
    return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def model_timer(model: torch.nn.Module, prefix: int, vocab: int, max_size: int):  # noqa: ANN201
    """One draft forward of ``size`` tree nodes (siblings) over a ``prefix``-token cache, its top-1
    read back as a drafting layer reads it; the nodes are dropped again."""
    cache = DynamicCache(config=model.config)
    ids = torch.randint(0, 1000, (prefix + max_size,), generator=torch.Generator().manual_seed(0))
    forward_hidden(model, cache, ids[:prefix], torch.arange(prefix), None)

    def time_once(size: int) -> float:
        visible = torch.ones(size, prefix + size, dtype=torch.bool)  # (T, S + T)
        visible[:, prefix:] = torch.eye(size, dtype=torch.bool)
        with torch.inference_mode():
            start = time.perf_counter()
            hidden = forward_hidden(model, cache, ids[prefix:prefix + size], torch.full((size,), prefix), visible)
            lm_logits(model, hidden, vocab).topk(1, dim=-1)[1].tolist()
            seconds = time.perf_counter() - start
        gather_entries(cache, list(range(prefix)))
        return seconds

    return time_once


def best(time_once, sizes: tuple[int, ...], reps: int) -> dict[int, float]:  # noqa: ANN001 - a probe timer
    time_once(sizes[0])  # warm-up
    return {s: min(time_once(s) for _ in range(reps)) for s in sizes}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.eagle3_cost", description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    start = time.perf_counter()
    head = llama_head(dtype)
    head_ms = {s: round(1e3 * t, 2) for s, t in best(pair_timer(head, PREFIX, 0, max(SIZES)), SIZES, args.reps).items()}
    del head
    draft = draft_model(dtype)
    draft_ms = {s: round(1e3 * t, 2) for s, t in best(model_timer(draft, PREFIX, DRAFT_VOCAB, max(SIZES)), SIZES,
                                                       args.reps).items()}
    report = {"cpu": hardware_name(torch.device("cpu")), "dtype": args.dtype, "threads": torch.get_num_threads(),
              "torch": torch.__version__, "python": platform.python_version(), "prefix": PREFIX,
              "head_ms": head_ms, "draft_1b_ms": draft_ms,
              "head_over_draft": {s: round(head_ms[s] / draft_ms[s], 3) for s in SIZES}}
    report["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
