"""Talon's step measured on a device with real acceptance: the shape replay (``talon.atlas.shape``).

A preset's pair at its real shapes (random weights) runs every forward of a real run on this
device, answered from the bundled lesson atlases (the embedded pair's real acceptance), for
``none``, ``retrieval``, ``model`` and ``hybrid``; HF ``generate()`` of the same target runs in
the same call, and beside each measured figure stands the atlas replay's prediction on the cost
curves this device probed.

    python -m talon.gpucheck.shape --pair qwen2.5-7b --out shape.json        # CUDA: the preset's shapes
    python -m talon.gpucheck.shape --tiny                                     # anywhere, in seconds

``--tiny``: the tiny pair, on atlases recorded on it first (the lesson atlases' ids need a real
vocabulary). A head preset (``--pair llama-3.1-8b-eagle3``): its head trained on the device on
the random target's text (``talon.gpucheck.head``), atlases recorded with it on the prompts it
learnt, ``none``, ``retrieval``, ``eagle3`` and ``eagle3-hybrid`` measured and predicted.
Prints one JSON report (also to ``--out``) and a table; exits 1 if a replay left the atlas or
decoded another text.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from talon.atlas.data import Atlas
from talon.atlas.record import record_atlas
from talon.atlas.result import replayable_kinds
from talon.atlas.shape import shape_replay
from talon.engine.engine import Engine
from talon.gpucheck.pairs import (
    BF16,
    F32,
    PairModels,
    PairSpec,
    pair_specs,
    path_engine,
    prompt_ids,
    random_ids,
    random_model,
    reference,
)
from talon.graphs.static import BUILT
from talon.knobs import DRAFTERS
from talon.lessons import bundled_atlases
from talon.models import LoadedModel
from talon.run_config import RunConfig, TreeConfig


def atlases_for(engine: Engine, tiny: bool, limit: int, tokens: int) -> list[Atlas]:
    if not tiny:
        return bundled_atlases()[:limit]
    vocab = engine.draft.model.get_input_embeddings().num_embeddings
    cfg = RunConfig(max_new_tokens=tokens, draft_vocab=0)
    recorder = Engine(engine.target, engine.target)  # the target drafting for itself: drafts accepted, as a real pair's
    return [record_atlas(recorder, random_ids(vocab, 48, seed), cfg) for seed in range(limit)]


def config(atlas: Atlas, drafter: str, tokens: int, cost_aware: bool) -> RunConfig:
    vocab = int(atlas.models.get("draft_vocab", RunConfig().draft_vocab))
    return RunConfig(drafter=drafter, tree=TreeConfig(cost_aware=cost_aware), max_new_tokens=tokens, draft_vocab=vocab,
                     cost_model="fixed")  # planned on the snapshot, as the atlas replay beside it plans


def timed_generate(engine: Engine, ids: list[int], n: int) -> float:
    """Seconds HF ``generate()`` of the target takes for ``n`` greedy tokens after ``ids``."""
    sync = torch.cuda.synchronize if engine.target.device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    reference(engine.target, ids, n)
    sync()
    return time.perf_counter() - start


def head_pair(spec: PairSpec, device: torch.device, dtype: torch.dtype, tokens: int) -> tuple[Engine, list[Atlas]]:
    """A head preset's engine and atlases: its head trained on the float32 random target's greedy
    text (``PairModels``, as the GPU check trains it), then moved onto the same target in ``dtype``
    (seeded alike: the same weights); the atlases recorded with the head on the prompts it was
    trained on, so its acceptance is the trained head's own."""
    models = PairModels(spec, device, tokens)
    head = models.get("draft", F32).model
    target = models.get("target", F32) if dtype == F32 else random_model(spec.target, spec.family, 1, dtype, device)
    models.keep((("draft", F32),) if dtype != F32 else (("target", F32), ("draft", F32)))
    head.__dict__["embed"] = target.model.get_input_embeddings()
    head = head.to(dtype)
    engine = Engine(target, LoadedModel(head, target.tokenizer, f"trained-head-{spec.key}", dtype, device))
    vocab = spec.draft.vocab
    cfg = RunConfig(drafter="eagle3-hybrid", max_new_tokens=tokens, draft_vocab=0)
    cover = [RunConfig(drafter=kind, max_new_tokens=tokens, draft_vocab=0, cost_model="fixed",
                       tree=TreeConfig(cost_aware=False)) for kind in ("eagle3", "eagle3-hybrid", "retrieval")]
    return engine, [record_atlas(engine, ids, cfg, cover=cover)  # every measured kind replays exactly
                    for ids in (random_ids(vocab, 48, 3), prompt_ids(vocab, 48, 3))]


def measure(engine: Engine, atlases: list[Atlas], tokens: int, cost_aware: bool) -> dict[str, Any]:
    """Per drafter: tokens, measured and predicted seconds, the step's parts; whether every replay
    stayed in its atlas, grew the trees the atlas replay grows and decoded its text (``faithful``);
    what the timed runs built (``built_while_timed``: static forwards, graph captures, compiles;
    none, or the clock timed them: ``clean_clock``); and ``generate()`` over the same prompts.
    Every configuration runs once untimed first, so every bucket and pool it reaches is built."""
    slot = sorted((k for k in replayable_kinds(atlases[0]) if k not in ("none", "retrieval")),
                  key=lambda k: DRAFTERS[k].retrieval)  # the draft slot alone, then with retrieval
    kinds = ("none", "retrieval", *slot)
    for atlas in atlases:  # warm: every pool, bucket capture and compile the timed runs will reach
        for drafter in kinds:
            shape_replay(engine, atlas, config(atlas, drafter, tokens, cost_aware))
        reference(engine.target, list(atlas.prompt_ids), 2)
    built = dict(BUILT)
    rows: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    faithful = True
    for atlas in atlases:
        for drafter in kinds:  # none, retrieval, the draft slot alone, then with retrieval: each adds a source
            result = shape_replay(engine, atlas, config(atlas, drafter, tokens, cost_aware))
            s, row = result.summary, rows[drafter]
            faithful &= (result.coverage.misses == 0 and result.same_trees
                         and s.token_ids == list(atlas.output[:len(s.token_ids)]))
            row["tokens"] += len(s.token_ids)
            row["steps"] += s.steps
            row["seconds"] += s.seconds
            row["predicted_s"] += result.predicted.seconds
            for part in ("draft_s", "verify_s", "other_s"):
                row[part] += sum(getattr(step, part) for step in result.steps)
        n = min(tokens, len(atlas.output))  # what each replay of this atlas decodes
        rows["generate()"]["tokens"] += n
        rows["generate()"]["seconds"] += timed_generate(engine, list(atlas.prompt_ids), n)
    timed = {kind: n - built.get(kind, 0) for kind, n in BUILT.items() if n != built.get(kind, 0)}
    return {"faithful": faithful, "built_while_timed": timed, "clean_clock": not timed,
            "rows": {k: dict(v) for k, v in rows.items()}}


def shape_table(report: dict[str, Any]) -> str:
    rows = report["rows"]
    base = rows["none"]["tokens"] / rows["none"]["seconds"]
    lines = ["| method | tok/s | vs none | predicted tok/s | MAT | draft share |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in rows.items():
        speed = r["tokens"] / r["seconds"]
        predicted = f"{r['tokens'] / r['predicted_s']:.1f}" if r.get("predicted_s") else ""
        mat = f"{r['tokens'] / r['steps']:.2f}" if r.get("steps") else ""
        share = f"{r['draft_s'] / r['seconds']:.0%}" if r.get("steps") else ""
        lines.append(f"| {name} | {speed:.1f} | {speed / base:.2f}x | {predicted} | {mat} | {share} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", default="qwen2.5-7b", help="a GPU preset's key (its shapes)")
    p.add_argument("--tiny", action="store_true", help="the tiny pair on the CPU, atlases recorded on it")
    p.add_argument("--forward", "--step", dest="forward", default="auto",
                   help="the engine's path, e.g. graphs, static+fold (auto: the device's proven default; "
                   "--step is its former name)")
    p.add_argument("--limit", type=int, default=12, help="atlases (the bundled lesson atlases: 12)")
    p.add_argument("--tokens", type=int, default=64, help="new tokens a replay (at most the atlas's text)")
    p.add_argument("--planner", choices=("on", "off"), default="off",
                   help="cost-aware planning on this device's curves")
    p.add_argument("--out", type=Path, help="also write the JSON report here")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if device.type == "cpu" and not args.tiny:
        print("no CUDA device: run with --tiny for the CPU-sized replay", file=sys.stderr)
        return 2
    spec = pair_specs(args.tiny, {args.pair})[0]
    dtype = F32 if args.tiny else BF16
    if spec.head:  # a head preset: its head trained here, atlases recorded with it
        engine, atlases = head_pair(spec, device, dtype, args.tokens)
        if args.forward != "auto":
            engine = path_engine(engine.target, engine.draft, args.forward)
    else:
        target = random_model(spec.target, spec.family, 1, dtype, device)
        draft = random_model(spec.draft, spec.family, 2, dtype, device)
        # auto: the device kind's proven path
        engine = Engine(target, draft) if args.forward == "auto" else path_engine(target, draft, args.forward)
        atlases = atlases_for(engine, args.tiny, args.limit, args.tokens)
    report = {"pair": spec.key, "tiny": args.tiny, "device": torch.cuda.get_device_name() if device.type == "cuda"
              else "cpu", "dtype": str(dtype).removeprefix("torch."), "forward": engine.forward_path,
              "atlases": len(atlases), "tokens": args.tokens, "cost_aware": args.planner,
              **measure(engine, atlases, args.tokens, args.planner == "on")}
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    print(text)
    print(shape_table(report))
    if not report["clean_clock"]:
        print(f"the timed runs built {report['built_while_timed']}: their clock is not decoding alone", file=sys.stderr)
    return 0 if report["faithful"] and report["clean_clock"] else 1


if __name__ == "__main__":
    sys.exit(main())
