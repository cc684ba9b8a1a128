"""Record the app's opening view: run the embedded pair on candidate prompts (the bundled
SpecBench examples, in the order the app lists them) and keep the first run that beats plain
decoding clearly (``CLEAR_WIN``, on its own cost curve) and meets the teaching criterion of ``talon.figures.opening``
(or, if none does, the one that comes closest: a winning run first).

    .venv/bin/python -m scripts.record_opening [--out static/recording.json] [--max-new-tokens 48]
    .venv/bin/python -m scripts.record_opening --temperature 0.8 --out static/recording_sampled.json

With ``--temperature`` the run samples (seed 0) and a step whose draft was rejected by chance,
its token redrawn from the residual, is required too: the acceptance rule drawn with no model.

The prompt and settings that produced the recording travel inside it (``summary.prompt`` and
``summary.config``); the app sets its prompt box and controls from them.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path

from talon.engine.build import build_engine
from talon.engine.engine import Engine, generate
from talon.figures.opening import criterion_score, opening_criterion, opening_step
from talon.figures.payoff import plain_rate
from talon.models import EMBEDDED_DRAFT, EMBEDDED_TARGET
from talon.run_config import RunConfig, SamplingConfig
from talon.server.examples import load_examples
from talon.settings import PairKey, Settings
from talon.trace import dump_trace

logger = logging.getLogger("record_opening")
OUT = Path(__file__).resolve().parents[1] / "static" / "recording.json"
CLEAR_WIN = 1.05  # the opening run must beat plain decoding by this much on its own cost curve


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--candidates", type=int, default=0, help="try at most this many prompts (0 = all)")
    p.add_argument("--temperature", type=float, default=0.0, help="sample at this temperature (seed 0)")
    p.add_argument("--cost-aware", choices=["on", "off"], default="on",
                   help="off where planning skips the draft model on most steps (a CPU host): every step drafts")
    args = p.parse_args(argv)
    settings = Settings.from_env()
    engine = build_engine(PairKey.from_settings(settings, target=EMBEDDED_TARGET, draft=EMBEDDED_DRAFT,
                                                dtype=args.dtype, device="cpu", allow_remote_code=False))
    cfg = RunConfig().replace(max_new_tokens=args.max_new_tokens, cost_model="fixed")
    cfg = cfg.replace(tree=dataclasses.replace(cfg.tree, cost_aware=args.cost_aware == "on"))
    if args.temperature > 0:
        cfg = cfg.replace(sampling=SamplingConfig(temperature=args.temperature, seed=0))
    examples = load_examples()
    if args.candidates:
        examples = examples[: args.candidates]
    best = None
    for example in examples:
        summary, steps = generate(engine, example.prompt, cfg)
        plain = plain_rate(summary if summary.cost_model else
                           dataclasses.replace(summary, cost_model=measured_costs(engine, cfg)))
        ratio = summary.tokens_per_second / plain.tokens_per_s if plain is not None else 0.0
        redrawn = args.temperature <= 0 or any(st.bonus_kind == "resampled" and st.accept_len for st in steps)
        score = (redrawn, ratio >= CLEAR_WIN, *criterion_score(steps))
        logger.info("%-80s %.2fx plain decoding, met %d of %d, %d rich steps, MAT %.2f", example.label[:80], ratio,
                    score[2], len(opening_criterion(steps)), score[3], summary.mean_accepted_tokens)
        if best is None or score > best[0]:
            best = (score, example, summary, steps)
        if score[0] and score[1] and all(opening_criterion(steps).values()):
            break
    assert best is not None, "no example prompts"
    _, example, summary, steps = best
    if not summary.cost_model:  # planning was off: keep the host's measured curves for the cost view
        summary = dataclasses.replace(summary, cost_model=measured_costs(engine, cfg))
    dump_trace(str(args.out), summary, steps)
    for requirement, met in opening_criterion(steps).items():
        logger.info("  [%s] %s", "x" if met else " ", requirement)
    logger.info("wrote %s: %s (%d steps, opens on step %d; %s, %s)", args.out, example.label, len(steps),
                opening_step(steps), summary.dtype, summary.device)
    return 0


def measured_costs(engine: Engine, cfg: RunConfig) -> dict:
    """The pair's measured cost curves, marked as not planned on (cost-aware planning was off)."""
    return {**engine.cost_snapshot(cfg.draft_vocab).to_dict(), "mode": "measured, not planned on"}


if __name__ == "__main__":
    sys.exit(main())
