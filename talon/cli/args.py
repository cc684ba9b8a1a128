"""The flags every command line shares: the model pair (``add_model_args``), every RunConfig
knob (``add_run_args``) and the record they build (``config_from_args``), and comma lists.
Choices and defaults come from where they are defined (``talon.settings``,
``talon.run_config``), so a new choice there is a new choice here."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from talon.run_config import (
    ADMISSIONS,
    COST_MODES,
    DRAFTER_KINDS,
    TREE_MODES,
    RetrievalConfig,
    RunConfig,
    SamplingConfig,
    TreeConfig,
)
from talon.settings import DRAFT_QUANTS, DTYPES, TARGET_WEIGHTS, Settings


def add_model_args(p: argparse.ArgumentParser, settings: Settings) -> None:
    p.add_argument("--target", default=settings.target, help="hub id, local dir, .gguf, or embedded:... (default: %(default)s)")
    p.add_argument("--draft", default=settings.draft, help="like --target, or 'none' (default: %(default)s)")
    p.add_argument("--dtype", default=settings.dtype, choices=DTYPES)
    p.add_argument("--device", default=settings.device, help="auto, cpu, cuda or cuda:N")
    p.add_argument("--draft-quant", default=settings.draft_quant, choices=DRAFT_QUANTS,
                   help="draft weights: int8 (fbgemm, CPU only; faster draft forwards, the output stays "
                   "the target's), none, or auto = int8 on a CPU (default: %(default)s)")
    p.add_argument("--target-weights", default=settings.target_weights, choices=TARGET_WEIGHTS,
                   help="target weights: dense (--dtype as loaded; auto is the same) or int4 (CPU only: int4 "
                   "weights in groups of 32, a GGUF's own Q4_K blocks where it has them, bf16 activations). "
                   "The packed module is the target: the output is its own greedy text (default: %(default)s)")


def add_run_args(p: argparse.ArgumentParser) -> None:
    """Every RunConfig knob; defaults come from the dataclasses so there is one source."""
    t, r, s, run = TreeConfig(), RetrievalConfig(), SamplingConfig(), RunConfig()
    p.add_argument("--drafter", default=run.drafter, choices=DRAFTER_KINDS)
    p.add_argument("--tree", default=t.mode, choices=TREE_MODES)
    p.add_argument("--budget", type=int, default=t.budget, help="N: draft nodes per verification")
    p.add_argument("--root-k", type=int, default=t.root_k, help="K: children of the root (never gated)")
    p.add_argument("--top-k", type=int, default=t.top_k, help="k: children per expanded tree node")
    p.add_argument("--mu", type=float, default=t.mu, help="gate: expand iff path_conf >= mu * layer max")
    p.add_argument("--max-depth", type=int, default=t.max_depth)
    p.add_argument("--min-conf", type=float, default=t.min_conf,
                   help="expand a layer only while its best path confidence is >= this (0 = off)")
    p.add_argument("--cost-aware", choices=["on", "off"], default="on" if t.cost_aware else "off",
                   help="goodput planning: a measured cost model (verify time vs tree size, draft time "
                   "per layer, probed once and cached; see --cost-model) and an acceptance model "
                   "calibrated per source stop the tree when the next layer does not pay, trim "
                   "unprofitable nodes and skip the draft model (and its prefill) on steps where "
                   "retrieval alone is expected to be faster; off = pure TALON budget fill (%(default)s)")
    p.add_argument("--admission", choices=ADMISSIONS, default=t.admission,
                   help="what ranks the nodes competing for the budget (adaptive and static trees): "
                   "calibrated = the acceptance model's P(node accepted), learnt per source during the "
                   "run; confidence = the raw product of q (%(default)s)")
    p.add_argument("--cost-model", choices=COST_MODES, default=run.cost_model,
                   help="fixed = plan on the measured curves as read at start (probe or cache) and on "
                   "predicted times only, so the same command gives the same trees; learn = refine "
                   "this run's copy from its own step timings (%(default)s; sampled runs always plan "
                   "fixed). `python -m talon costs --show` prints the curves and where they came from")
    p.add_argument("--retrieval-min-match", type=int, default=r.min_match)
    p.add_argument("--retrieval-max-continuation", type=int, default=r.max_continuation)
    p.add_argument("--graft-threshold", type=int, default=r.graft_threshold,
                   help="hybrid: graft retrieval when its match is at least this long")
    p.add_argument("--retrieval-branches", type=int, default=r.max_branches)
    p.add_argument("--corpus", default=None, help="jsonl/text file for a static retrieval datastore")
    p.add_argument("--temperature", type=float, default=s.temperature, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=s.top_p)
    p.add_argument("--sample-top-k", type=int, default=s.top_k, help="sampling top-k (0 = off)")
    p.add_argument("--seed", type=int, default=s.seed)
    p.add_argument("--max-new-tokens", type=int, default=run.max_new_tokens)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--no-chat-template", action="store_true")
    p.add_argument("--async", dest="async_draft", action="store_const", const=True, default=None,
                   help="pre-draft the next tree while the target verifies (default: on CUDA only)")
    p.add_argument("--no-async", dest="async_draft", action="store_const", const=False)
    p.add_argument("--draft-vocab", type=int, default=run.draft_vocab,
                   help="draft logits over the first V token ids only (0 = full vocabulary)")


def config_from_args(a: argparse.Namespace) -> RunConfig:
    """The RunConfig of ``add_run_args``'s flags (ConfigError for a value out of range)."""
    return RunConfig(
        drafter=a.drafter,
        tree=TreeConfig(a.tree, a.budget, a.root_k, a.top_k, a.mu, a.max_depth, a.min_conf, a.cost_aware == "on",
                        a.admission),
        retrieval=RetrievalConfig(
            a.retrieval_min_match, a.retrieval_max_continuation, a.graft_threshold,
            a.retrieval_branches, a.corpus,
        ),
        sampling=SamplingConfig(a.temperature, a.top_p, a.sample_top_k, a.seed),
        max_new_tokens=a.max_new_tokens,
        stop_strings=tuple(a.stop),
        chat_template=not a.no_chat_template,
        async_draft=bool(a.async_draft),
        draft_vocab=a.draft_vocab,
        cost_model=a.cost_model,
    )


def csv(text: str) -> tuple[str, ...]:
    """A comma list, blanks dropped."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def csv_of(kind: Callable[[str], Any]) -> Callable[[str], tuple]:
    """An argparse type: a comma list of ``kind`` values."""
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(x) for x in csv(text))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma list of {kind.__name__}, got {text!r}") from None

    return parse
