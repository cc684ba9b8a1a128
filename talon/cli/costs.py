"""``python -m talon costs --show | --probe | --clear``: the cached cost curves;
``--llama-bench``: llama.cpp's own batch costs, from its ``llama-bench``, as an engine cost file."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from talon.atlas.llamacpp_costs import costs_from_llama_bench
from talon.cli.args import add_knob, add_model_args, pair_from_args
from talon.cost.cache import MAX_AGE_DAYS, cache_path
from talon.cost.model import CostModel
from talon.knobs import KNOB
from talon.models import ModelLoadError
from talon.settings import Settings
from talon.trace import TraceFileError, read_json_upload

logger = logging.getLogger("talon")


def add_costs_parser(c: argparse.ArgumentParser, settings: Settings) -> None:
    c.description = (f"The measured cost curves, cached under {settings.cost_cache_dir} "
                     "(TALON_COST_CACHE, else TALON_CACHE/costs), one file per model pair, dtype, "
                     "device, draft vocabulary, hardware, torch version and thread count.")
    what = c.add_mutually_exclusive_group(required=True)
    what.add_argument("--show", action="store_true",
                      help="list every cached model: where and when measured, key figures")
    what.add_argument("--probe", "--refresh", dest="probe", action="store_true",
                      help="measure the curves of the given pair now, on the forward the server runs (TALON_FORWARD, "
                      "TALON_CHAIN, TALON_FOLD), and cache them")
    what.add_argument("--clear", action="store_true", help="remove every cached cost model")
    what.add_argument("--llama-bench", type=Path, metavar="TARGET.json",
                      help="read `llama-bench -o json` of the target (pp1..ppN and a tg row) into llama.cpp's "
                      "talon-engine-cost/1 file for `atlas sweep --engine llamacpp --costs`")
    c.add_argument("--llama-bench-draft", type=Path, metavar="DRAFT.json",
                   help="with --llama-bench: the draft model's llama-bench run (draft-simple's costs)")
    c.add_argument("--out", type=Path, help="with --llama-bench: where to write the cost file (default: stdout)")
    add_model_args(c, settings)
    add_knob(c, KNOB["draft_vocab"])


def costs_command(args: argparse.Namespace, settings: Settings) -> int:
    if args.llama_bench is not None:
        return llama_bench_command(args)
    folder = settings.cost_cache_dir
    if args.clear:
        removed = [p for p in sorted(folder.glob("*.json")) if p.is_file()]
        for path in removed:
            path.unlink()
        print(f"removed {len(removed)} cached cost model(s) from {folder}")
        return 0
    if args.show:
        files = sorted(folder.glob("*.json"))
        print(f"{len(files)} cached cost model(s) in {folder}")
        for path in files:
            print(describe_cached(path))
        return 0
    from talon.engine.build import build_engine  # torch: only the probe loads a model

    try:  # the engine the server and every command build, so the curves probed are the ones they read
        costs = build_engine(pair_from_args(args, settings)).cost_snapshot(args.draft_vocab, refresh=True)
    except (ValueError, ModelLoadError, OSError) as err:
        logger.error("%s", err)
        return 2
    print(describe_costs(costs, cache_path(folder, costs.key).name))
    return 0


def describe_cached(path: Path) -> str:
    """A few lines about one cached cost model: what it is for, where it came from, key figures."""
    try:
        costs = CostModel.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as err:
        return f"{path.name}: unreadable ({err})"
    return describe_costs(costs, path.name)


def describe_costs(costs: CostModel, name: str) -> str:
    age = costs.provenance.age_days()
    stale = " (stale: measured again at next use)" if age is None or age > MAX_AGE_DAYS else ""
    draft = f", draft layer 1/4/16 nodes {'/'.join(millis(costs.draft_s(n)) for n in (1, 4, 16))}" \
        if costs.draft is not None else ""
    return (f"{name}: {costs.key}\n  {costs.provenance.describe()}, "
            f"{'?' if age is None else f'{age:.1f}'} days old{stale}\n"
            f"  verify 1/4/16/64 nodes {millis(costs.verify_s(1))}/{millis(costs.verify_s(4))}/"
            f"{millis(costs.verify_s(16))}/{millis(costs.verify_s(64))}{draft}")


def millis(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms"


def llama_bench_command(args: argparse.Namespace) -> int:
    """``--llama-bench``: llama.cpp's batch costs from its own bench, with their provenance."""
    try:
        target = read_json_upload(args.llama_bench)
        draft = read_json_upload(args.llama_bench_draft) if args.llama_bench_draft is not None else None
        for name, rows in (("--llama-bench", target), ("--llama-bench-draft", draft)):
            if rows is not None and (not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows)):
                raise ValueError(f"{name}: not the output of `llama-bench -o json` (a list of rows)")
        costs = costs_from_llama_bench(target, draft)
    except (ValueError, OSError, TraceFileError) as err:
        logger.error("%s", err)
        return 2
    text = json.dumps(costs.to_dict(), indent=1)
    if args.out is None:
        print(text)
    else:
        args.out.write_text(text + "\n", encoding="utf-8")
        print(f"{args.out}: {costs.label}; {costs.source}")
    print(f"  target batch 1/2/4/16: {'/'.join(millis(costs.target_s(n)) for n in (1, 2, 4, 16))}"
          + (f"; draft 1/16: {millis(costs.draft_s(1))}/{millis(costs.draft_s(16))}" if costs.draft_batch_s else ""),
          file=sys.stderr if args.out is None else sys.stdout)
    return 0
