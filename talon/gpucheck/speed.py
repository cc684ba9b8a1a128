"""A GPU's step costs at a preset's real shapes (random weights), eager and replayed as CUDA
graphs, written as talon-cost/1 curves for ``python -m talon atlas sweep data/lessons --costs FILE``.

    python -m talon.gpucheck.speed --pair qwen2.5-7b --out-dir data/gpu_costs   # on a CUDA device

Measures, in bf16:
* eager: Talon's own cost probe (dynamic cache, one forward per size), as the engine runs today;
* static eager: the static-shape forward (talon/graphs/static.py) without graphs;
* graph: the same forward, each bucket captured once and replayed (timed with its buffer copies);
* the autoregressive baseline as a graph: a 1-token replay plus its argmax, and HF ``generate()``
  (greedy) as the peer;
* what capture costs (seconds, graph pool memory), and the replay's logits against eager's;
* Talon's own loop (``none`` and ``hybrid``) with the dynamic forward and with graphs.

Writes ``<device>-eager-<pair>.cost.json``, ``<device>-graph-<pair>.cost.json`` and
``<device>-<pair>.speed.json`` (every figure above).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch

from talon.cost.curve import CURVE_SIZES
from talon.cost.model import PROBED, synthetic_costs
from talon.cost.probe import probe_costs
from talon.engine.engine import Engine, generate
from talon.gpucheck.pairs import BF16, pair_specs, path_engine, prompt_ids, random_ids, random_model
from talon.graphs.static import StaticForward, bucket_for
from talon.run_config import RunConfig, TreeConfig

PREFIX = 256  # committed tokens in the cache while timing (the eager probe's prefix too)
REPS = 20


def timed(fn, reps: int = REPS) -> float:  # noqa: ANN001
    """Best seconds of ``reps`` calls, each synchronised."""
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def bucket_times(sf: StaticForward, sizes: list[int]) -> dict[int, float]:
    """Seconds of one step of each bucket size (buffers filled, forward, logits ready)."""
    out = {}
    for size in sizes:
        ids = torch.randint(0, 1000, (size,))
        pos = torch.arange(PREFIX, PREFIX + size)
        vis = torch.ones(size, size, dtype=torch.bool).tril()
        out[size] = timed(lambda: sf.forward(ids, pos, vis, PREFIX))
    return out


def static_times(model: torch.nn.Module, sizes: list[int], graphs: bool) -> tuple[dict[int, float], dict[str, Any]]:
    buckets = tuple(b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b <= max(sizes))
    sf = StaticForward(model, max_len=PREFIX + max(buckets) + 8, buckets=buckets)
    sf.prefill(torch.randint(0, 1000, (PREFIX,)))
    info: dict[str, Any] = {}
    if graphs:
        ids = torch.tensor([5, 6, 7])
        pos, vis = torch.arange(PREFIX, PREFIX + 3), torch.ones(3, 3, dtype=torch.bool).tril()
        eager = sf.forward(ids, pos, vis, PREFIX).clone()
        report = sf.capture(PREFIX)
        replay = sf.forward(ids, pos, vis, PREFIX)
        info = {"capture_s": round(report.seconds, 2), "graph_pool_gib": round(report.pool_bytes / 2**30, 3),
                "replay_vs_eager_max_logit_diff": round(float((replay - eager).abs().max()), 4),
                "same_argmax": bool((replay.argmax(-1) == eager.argmax(-1)).all())}
        argmax_one = timed(lambda: sf.forward(ids[:1], pos[:1], vis[:1, :1], PREFIX).argmax(-1).item())
        info["none_step_ms"] = round(1e3 * argmax_one, 3)
    times = bucket_times(sf, sorted({bucket_for(s, buckets) for s in sizes}))
    sf = None  # its slot cache and graph pool go before the cache is emptied
    torch.cuda.empty_cache()
    return {s: times[bucket_for(s, buckets)] for s in sizes}, info


def hf_generate_tok_s(model: torch.nn.Module, tokens: int = 64) -> float:
    x = torch.randint(0, 1000, (1, PREFIX), device=model.device)
    run = lambda: model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,  # noqa: E731
                                 max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=0)
    run()
    return tokens / timed(run, reps=2)


def step_split(steps) -> dict[str, float]:  # noqa: ANN001 - StepTrace list
    """Mean ms a step spends drafting, verifying and elsewhere (the loop's own clock)."""
    n = max(len(steps), 1)
    return {k: round(1e3 * sum(getattr(s, f"{k}_s") for s in steps) / n, 3) for k in ("draft", "verify", "other")}


LOOP_RUNS = (  # (step, drafter, async, prompt): prompt "chain" is accepted in part, "random" barely
    ("dynamic", "none", False, "random"), ("dynamic", "hybrid", False, "chain"),
    ("graphs", "none", False, "random"), ("graphs", "retrieval", False, "chain"),
    ("graphs", "model", False, "chain"), ("graphs", "hybrid", False, "chain"),
    ("graphs", "hybrid", True, "chain"), ("graphs", "hybrid", False, "random"),
    # the adaptive tree grown on the device (TALON_CHAIN=1): the same runs, draft time set against graphs'
    ("graphs+chain", "model", False, "chain"), ("graphs+chain", "hybrid", False, "chain"),
    ("graphs+chain", "hybrid", False, "random"),
)
DRAFT_RUN = ("graphs", "model", False, "random")  # chain trees: every draft forward 1 node (draft_overhead_s)


def loop_speeds(target, draft, spec, tokens: int = 128) -> dict[str, Any]:  # noqa: ANN001 - LoadedModel
    """Talon's own loop on these check models, per step implementation and drafter: tok/s, MAT,
    ms a step and its split. The check models share a planted bigram chain, so on the ``chain``
    prompt drafts are accepted in part (synthetic acceptance: the atlas sweep gives the real
    one); on ``random`` they are mostly rejected, which times the steps alone."""
    out: dict[str, Any] = {}
    prompts = {"chain": prompt_ids(spec.draft.vocab, PREFIX, 5), "random": random_ids(spec.draft.vocab, PREFIX, 5)}
    engines: dict[str, Engine] = {}
    for step, drafter, async_draft, which in (*LOOP_RUNS, DRAFT_RUN):
        if step not in engines:  # one engine a path, built once (its pools and graphs are reused)
            engines[step] = path_engine(target, draft, step)
        engine = engines[step]
        mode = "chain" if (step, drafter, async_draft, which) == DRAFT_RUN else "adaptive"
        cfg = RunConfig(drafter=drafter, max_new_tokens=tokens, chat_template=False, draft_vocab=0,
                        async_draft=async_draft, tree=TreeConfig(mode=mode, cost_aware=False))
        start = time.perf_counter()
        generate(engine, prompts[which], cfg)  # warm: the first run builds (and captures) its static forwards
        warm_s = time.perf_counter() - start
        summary, steps = generate(engine, prompts[which], cfg)
        key = f"{step}/{drafter}{'/async' if async_draft else ''}/{which}{'/chain-tree' if mode == 'chain' else ''}"
        out[key] = {"tok_s": round(summary.tokens_per_second, 2), "mat": round(summary.mean_accepted_tokens, 2),
                    "ms_per_step": round(1e3 * summary.seconds / max(len(steps), 1), 3),
                    "split_ms": step_split(steps), "first_run_s": round(warm_s, 2),
                    "draft_forwards_per_step": round(sum(s.draft_forwards for s in steps) / max(len(steps), 1), 3)}
        print(key, out[key], flush=True)
    del engines
    torch.cuda.empty_cache()
    return out


def loop_other_s(none_ms_per_step: float, costs) -> float:  # noqa: ANN001 - CostModel
    """What a ``none`` step of the loop costs beyond the curve's 1-token forward (the verdict,
    the commit, the trace): the curve's ``other_s``, which the cost model's default (5 ms) only
    guesses."""
    return max(none_ms_per_step / 1e3 - costs.verify_s(1), 0.0)


def draft_overhead_s(record: dict[str, Any], costs) -> float:  # noqa: ANN001 - CostModel
    """What the loop pays per draft forward beyond the curve's bare replay (its readout: softmax,
    top-k, the copy back; the tree's bookkeeping), from a run whose draft forwards are 1-node:
    the drafter's own clock, which a learning run's curve would hold."""
    forwards = record.get("draft_forwards_per_step", 0)
    if not forwards:
        return 0.0
    return max(record["split_ms"]["draft"] / 1e3 / forwards - costs.draft_s(1), 0.0)


def with_draft_overhead(costs, seconds: float):  # noqa: ANN001, ANN201 - CostModel
    """``costs`` with ``seconds`` added to every draft forward (``draft_overhead_s``)."""
    data = costs.to_dict()
    data["draft_s"] = [v + seconds for v in data["draft_s"]]
    adjusted = type(costs).from_dict(data)
    adjusted.provenance = dataclasses.replace(
        costs.provenance, weights=f"{costs.provenance.weights}; each draft forward + {1e3 * seconds:.2f} ms of the "
        "loop's readout", fields={**costs.provenance.fields, "draft_s": f"derived: each probed replay + "
                                 f"{1e3 * seconds:.2f} ms of the loop's readout, measured by talon/gpucheck/speed.py"})
    return adjusted


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", default="qwen2.5-7b")
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--no-loop", action="store_true", help="the curves only, not Talon's loop")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: the speed probe measures a GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    spec = pair_specs(False, {args.pair})[0]
    name = torch.cuda.get_device_name(device)
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower().removeprefix("nvidia ")).strip("-")
    start = time.perf_counter()
    target = random_model(spec.target, spec.family, 1, BF16, device, chain_vocab=spec.draft.vocab)
    draft = random_model(spec.draft, spec.family, 2, BF16, device, chain_vocab=spec.draft.vocab, untie=False)
    report: dict[str, Any] = {"device": name, "torch": torch.__version__, "pair": args.pair, "dtype": "bfloat16",
                              "prefix": PREFIX, "build_s": round(time.perf_counter() - start, 1)}
    eager = probe_costs(target.model, draft.model, prefix=PREFIX, max_tree=CURVE_SIZES[-1], max_reps=4)
    verify_sizes, draft_sizes = list(CURVE_SIZES), [g for g in CURVE_SIZES if g <= 32]
    report["eager_ms"] = {"verify": {n: round(1e3 * eager.verify_s(n), 3) for n in verify_sizes},
                          "draft": {n: round(1e3 * eager.draft_s(n), 3) for n in draft_sizes}}
    curves: dict[str, Any] = {}
    for label, graphs in (("static_eager", False), ("graph", True)):
        v, vinfo = static_times(target.model, verify_sizes + [256], graphs)
        d, dinfo = static_times(draft.model, draft_sizes, graphs)
        curves[label] = (v, d)
        report[f"{label}_ms"] = {"verify": {n: round(1e3 * s, 3) for n, s in v.items()},
                                 "draft": {n: round(1e3 * s, 3) for n, s in d.items()}}
        if graphs:
            report["graph_target"], report["graph_draft"] = vinfo, dinfo
    report["hf_generate_tok_s"] = round(hf_generate_tok_s(target.model), 2)
    report["loop"] = {} if args.no_loop else loop_speeds(target, draft, spec)
    v, d = curves["graph"]
    graph = synthetic_costs({n: v[n] for n in CURVE_SIZES}, {n: d[n] for n in draft_sizes}, other_s=eager.other_s,
                            prefill_per_token_s=eager.prefill_per_token_s)
    graph.provenance = dataclasses.replace(eager.provenance, weights="cuda-graph replay (talon/graphs/static.py)",
                                           fields=dict(PROBED))  # its own replays, probed here
    graph.key = f"{args.pair}/graph"
    eager.key = f"{args.pair}/eager"
    for costs, run in ((eager, "dynamic/none/random"), (graph, "graphs/none/random")):
        if run in report["loop"]:  # a step's cost beyond its forward, as the loop measured it
            costs.other_s = loop_other_s(report["loop"][run]["ms_per_step"], costs)
            costs.provenance = dataclasses.replace(costs.provenance, fields={**costs.provenance.fields, "other_s": (
                "fitted: the loop's measured `none` step (talon/gpucheck/speed.py) less the 1-token forward, so the "
                "predicted `none` equals that measured loop (not an independent prediction)")})
    if "graphs/model/random/chain-tree" in report["loop"]:  # and a draft forward's beyond its replay
        record = report["loop"]["graphs/model/random/chain-tree"]
        report["draft_overhead_ms"] = round(1e3 * draft_overhead_s(record, graph), 3)
        graph = with_draft_overhead(graph, report["draft_overhead_ms"] / 1e3)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for label, costs in (("eager", eager), ("graph", graph)):
        (args.out_dir / f"{slug}-{label}-{args.pair}.cost.json").write_text(json.dumps(costs.to_dict(), indent=1))
    g = report["graph_ms"]
    loop = report["loop"]
    report["aims"] = {} if not loop else {"draft_1_over_verify_1": round(g["draft"][1] / g["verify"][1], 3),
                      "verify_64_over_verify_1": round(g["verify"][64] / g["verify"][1], 3),
                      "none_step_over_bare_replay": round(loop["graphs/none/random"]["ms_per_step"]
                                                          / report["graph_target"]["none_step_ms"], 3),
                      "hybrid_chain_over_none": round(loop["graphs/hybrid/chain"]["tok_s"]
                                                      / loop["graphs/none/random"]["tok_s"], 3),
                      "hybrid_chain_over_generate": round(loop["graphs/hybrid/chain"]["tok_s"]
                                                          / report["hf_generate_tok_s"], 3)}
    report["total_s"] = round(time.perf_counter() - start, 1)
    text = json.dumps(report, indent=1)
    (args.out_dir / f"{slug}-{args.pair}.speed.json").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
