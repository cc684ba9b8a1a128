"""``python -m talon``: ``generate`` (one prompt, here), ``costs`` (``talon.cli.costs``),
``atlas record | sweep`` (``talon.cli.atlas``), ``lessons`` and ``export`` (``talon.cli.lessons``).

A command that neither loads a model nor replays an atlas imports no torch (``--help``, ``costs
--show | --clear | --llama-bench``, ``atlas sweep`` for a serving engine: a second, not six): the
engine is imported where a command builds one (``talon.engine.build``, inside the command)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from talon.cli.args import add_model_args, add_run_args, config_from_args, pair_from_args
from talon.cli.atlas import add_atlas_parser, atlas_command
from talon.cli.costs import add_costs_parser, costs_command
from talon.cli.lessons import add_export_parser, add_lessons_parser, export_command, lessons_command
from talon.models import ModelLoadError
from talon.settings import Settings
from talon.trace import dump_trace

logger = logging.getLogger("talon")


def parser(settings: Settings) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m talon", description="Talon tree speculative decoding")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate from one prompt")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="read the prompt from this file")
    add_model_args(g, settings)
    add_run_args(g)
    g.add_argument("--trace-out", help="write every step's trace (JSON) here")
    g.add_argument("--json", action="store_true", help="print one JSON object to stdout")
    add_costs_parser(sub.add_parser("costs", help="show, re-measure or remove the cached cost curves"), settings)
    add_atlas_parser(sub.add_parser("atlas", help="record a draft atlas, or sweep configurations over atlases "
                                    "(no model)"), settings)
    add_lessons_parser(sub.add_parser("lessons", help="the papers' claims replayed on atlases (no model)"))
    add_export_parser(sub.add_parser("export", help="a run, its walk and the lessons as one offline HTML file"))
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    args = parser(settings).parse_args(argv)
    if args.command == "costs":
        return costs_command(args, settings)
    if args.command == "atlas":
        return atlas_command(args, settings)
    if args.command == "lessons":
        return lessons_command(args)
    if args.command == "export":
        return export_command(args)
    if args.draft.lower() == "none" and args.drafter == "hybrid":
        logger.info("--draft none: drafting from retrieval only")
        args.drafter = "retrieval"
    try:
        cfg = config_from_args(args, one_drafter=True)
        prompt = args.prompt
        if args.prompt_file:
            with open(args.prompt_file, encoding="utf-8") as fh:
                prompt = fh.read()
        from talon.engine.build import build_engine  # torch: only a command that loads a model
        from talon.engine.engine import generate

        if cfg.needs_mtp:  # refused before any weight loads
            from talon.models.mtp import check_mtp_spec

            check_mtp_spec(args.target)

        # layerskip and mtp draft with the target itself, retrieval with none
        engine = build_engine(pair_from_args(args, settings, args.draft if cfg.uses_draft_slot else "none"))
        summary, steps = generate(engine, prompt, cfg)
    except (ValueError, ModelLoadError, OSError) as err:  # ConfigError, PromptError, bad corpus
        logger.error("%s", err)
        return 2
    if args.trace_out:
        dump_trace(args.trace_out, summary, steps)
    if args.json:
        print(json.dumps(summary.to_dict()))
    else:
        print(summary.text)
        logger.info(
            "%d tokens, %d steps, MAT %.2f, %.2f tokens/s, %.1f s (%s, %s, step %s)",
            len(summary.token_ids), summary.steps, summary.mean_accepted_tokens,
            summary.tokens_per_second, summary.seconds, summary.device, summary.dtype, summary.forward_path,
        )
    return 0
