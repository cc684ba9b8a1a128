"""``python -m talon lessons [ATLAS...]``: the papers' claims, replayed on atlases (the shipped
lesson atlases by default): why adaptive (TALON), why hybrid and why async (Talon), per suite."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from talon.atlas.data import load_atlases
from talon.cli.args import add_knob
from talon.figures.export import export_html
from talon.figures.opening import RECORDING
from talon.knobs import KNOB
from talon.lessons import LESSONS_DIR, bundled_atlases
from talon.lessons.adaptive import EAGLE3_SHAPE, EAGLE3_SOURCE, adaptive_lesson, adaptive_table, funnel, summarize
from talon.lessons.asynchrony import GPU_COSTS, async_lesson, async_table
from talon.lessons.hybrid import hybrid_lesson, hybrid_table
from talon.trace import TraceFileError, parse_trace, read_json_upload

logger = logging.getLogger("talon")


def add_lessons_parser(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.split("\n\n")[0]
    p.add_argument("atlases", nargs="*", type=Path, help=f"atlas files or folders (default: {LESSONS_DIR})")
    p.add_argument("--lesson", choices=["adaptive", "hybrid", "async", "all"], default="all")
    add_knob(p, KNOB["budget"], EAGLE3_SHAPE["budget"], "the equal budget N of the adaptive lesson (EAGLE-3's)")
    p.add_argument("--json", action="store_true", help="print the per-prompt numbers as JSON")


def add_export_parser(p: argparse.ArgumentParser) -> None:
    p.description = ("One self-contained HTML file (Plotly inlined, no server, no network): a run's steps with the "
                     "step slider and the guided walk, and the lessons of one lesson atlas.")
    p.add_argument("--trace", type=Path, default=None,
                   help="a talon-trace/1 file (python -m talon generate --trace-out; "
                   "default: the app's opening recording)")
    p.add_argument("--lesson", type=int, default=0,
                   help="which bundled lesson atlas (0-based, suites in order; default 0)")
    p.add_argument("--atlas", type=Path, default=None, help="an atlas of your own instead of a bundled one")
    add_knob(p, KNOB["budget"], EAGLE3_SHAPE["budget"], "the adaptive lesson's budget N")
    p.add_argument("--out", type=Path, required=True, help="the HTML file to write")


def export_command(args: argparse.Namespace) -> int:
    try:
        summary, steps = parse_trace(read_json_upload(args.trace or RECORDING))
        bundled = bundled_atlases()
        if args.atlas is not None:
            atlas, lessons, index = load_atlases([args.atlas])[0], [], 0
        else:
            if not 0 <= args.lesson < len(bundled):
                raise ValueError(f"--lesson must be in [0, {len(bundled) - 1}], got {args.lesson}")
            atlas, index = bundled[args.lesson], args.lesson
            lessons = [adaptive_lesson(a, args.budget) for a in bundled]
        if args.atlas is not None:
            lessons = [adaptive_lesson(atlas, args.budget)]
        page = export_html(summary, steps, atlas, lessons, index)
        args.out.write_text(page, encoding="utf-8")
    except (TraceFileError, ValueError, OSError) as err:
        logger.error("%s", err)
        return 2
    logger.info("wrote %s (%.1f MB): open it in any browser, offline", args.out, args.out.stat().st_size / 1e6)
    return 0


def lessons_command(args: argparse.Namespace) -> int:
    try:
        atlases = load_atlases(args.atlases) if args.atlases else bundled_atlases()
    except (TraceFileError, OSError) as err:
        logger.error("%s", err)
        return 2
    out: dict = {}
    if args.lesson in ("adaptive", "all"):
        lessons = [adaptive_lesson(a, args.budget) for a in atlases]
        ranks, depths = funnel(lessons)
        out["adaptive"] = {"budget": args.budget, "eagle3": EAGLE3_SHAPE, "eagle3_source": EAGLE3_SOURCE,
                           "funnel_rank": ranks, "funnel_depth": depths,
                           "prompts": [{"suite": x.suite, "static_mat": x.static_mat, "best_depth": x.best_depth,
                                        "eagle3_mat": x.eagle3_mat, "adaptive_mat": x.adaptive_mat,
                                        "coverage": x.coverage} for x in lessons]}
        if not args.json:
            print(f"Why adaptive: MAT at an equal budget N={args.budget}, the draft model alone; EAGLE-3's shape "
                  f"is K = k = 10, depth 8 (its default, with N = 59: {EAGLE3_SOURCE})\n")
            print(adaptive_table(summarize(lessons)))
            shares = ", ".join(f"{r}: {100 * v:.0f} %" for r, v in ranks.items())
            print("\nAccepted adaptive nodes by sibling rank: " + shares)
            print("by depth: " + ", ".join(f"{d}: {100 * v:.0f} %" for d, v in depths.items()) + "\n")
    if args.lesson in ("hybrid", "all"):
        lessons = [hybrid_lesson(a) for a in atlases]
        out["hybrid"] = [{"suite": x.suite, "mat": x.mat, "tokens_per_s": x.tokens_per_s, "carried": x.carried,
                          "coverage": x.coverage} for x in lessons]
        if not args.json:
            print("Why hybrid: the app's default configuration with each drafter (predicted tok/s from each "
                  "atlas's cost curves)\n")
            print(hybrid_table(lessons))
    if args.lesson in ("async", "all"):
        timelines = [async_lesson(a) for a in atlases]
        out["async"] = [{"suite": x.suite, **{name: {"sync_s": b.sync_s, "async_s": b.async_s, "draft_s": b.draft_s,
                                                     "verify_s": b.verify_s, "tokens": b.tokens}
                                              for name, b in (("host", x.host), ("gpu", x.gpu))}}
                        for x in timelines]
        if not args.json:
            print("\nWhy async: drafting's share of a step and the bound with drafting hidden behind verification, "
                  f"under each atlas's curves and an H100's measured ones ({GPU_COSTS.name})\n")
            print(async_table(timelines))
    if args.json:
        print(json.dumps(out))
    return 0
