"""The flags every command line shares: the model pair (``add_model_args``), every RunConfig
knob (``add_run_args``, from the knob table ``talon.knobs``) and the record they build
(``config_from_args``), and comma lists. Choices and defaults come from where they are defined
(``talon.settings``, ``talon.knobs``), so a new choice there is a new choice here."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from talon.knobs import KNOB, KNOBS, ON_OFF, Knob, unread_knobs
from talon.run_config import ConfigError, RunConfig
from talon.settings import DRAFT_QUANTS, DTYPE_CHOICES, TARGET_WEIGHTS, PairKey, Settings


def add_model_args(p: argparse.ArgumentParser, settings: Settings) -> None:
    p.add_argument("--target", default=settings.target,
                   help="hub id, local dir, .gguf, or embedded:... (default: %(default)s)")
    p.add_argument("--draft", default=settings.draft, help="like --target, or 'none' (default: %(default)s)")
    p.add_argument("--dtype", default=settings.dtype, choices=DTYPE_CHOICES)
    p.add_argument("--device", default=settings.device, help="auto, cpu, cuda or cuda:N")
    p.add_argument("--draft-quant", default=settings.draft_quant, choices=DRAFT_QUANTS,
                   help="draft weights: int8 (fbgemm, CPU only; faster draft forwards, the output stays "
                   "the target's), none, or auto = int8 on a CPU (default: %(default)s)")
    p.add_argument("--target-weights", default=settings.target_weights, choices=TARGET_WEIGHTS,
                   help="target weights: dense (--dtype as loaded; auto is the same) or int4 (CPU only: int4 "
                   "weights in groups of 32, a GGUF's own Q4_K blocks where it has them, bf16 activations). "
                   "The packed module is the target: the output is its own greedy text (default: %(default)s)")
    p.add_argument("--aux-layers", type=aux_layers_arg, default=(), metavar="I,J,K",
                   help="with an EAGLE-3 head as --draft: the target's hidden states it reads, as HF "
                   "output_hidden_states indices (0 the embedding, i the input of layer i; vLLM's and speculators' "
                   "ids; a SpecForge id is one less), over what its config says (docs/design.md: EAGLE-3 heads)")


def aux_layers_arg(text: str) -> tuple[int, ...]:
    """``--aux-layers``: a comma list of hidden-state indices, each at least 0, in the order the
    head concatenates them."""
    try:
        ids = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma list of integers, e.g. 2,14,25; got {text!r}") from None
    if not ids or any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"indices of at least 0, e.g. 2,14,25; got {text!r}")
    return ids


def pair_from_args(args: argparse.Namespace, settings: Settings, draft: str | None = None) -> PairKey:
    """The pair ``add_model_args``' flags name, on the settings' step, fold, chain and layout
    (``talon.engine.build``: every front end's engine is built the same way). ``draft``: instead of
    ``--draft`` (``none`` for a drafter that needs no draft model)."""
    return PairKey.from_settings(settings, target=args.target, draft=args.draft if draft is None else draft,
                                 dtype=args.dtype, device=args.device, draft_quant=args.draft_quant,
                                 target_weights=args.target_weights, aux_layers=args.aux_layers)


def add_run_args(p: argparse.ArgumentParser) -> None:
    """Every RunConfig knob, from the knob table (``talon.knobs``): one flag each, its default,
    choices and help from there; ranges are checked once, when the record is built."""
    for knob in KNOBS:
        add_knob(p, knob)


def add_knob(p: argparse.ArgumentParser, knob: Knob, default: Any = None, help_text: str = "") -> None:
    """One knob's flag (``default``, ``help_text``: a front end's own, e.g. the benchmark's)."""
    if default is None:
        default = knob.default
    help_text = (help_text or knob.help).replace("%", "%%") + " (default: %(default)s)"
    if knob.cli == "pair":
        p.add_argument(knob.option, dest=knob.name, action="store_const", const=True, default=None, help=help_text)
        p.add_argument(f"--no-{knob.option[2:]}", dest=knob.name, action="store_const", const=False)
    elif knob.cli == "negate":
        p.add_argument(knob.option, dest=knob.name, action="store_false", default=True, help=knob.help)
    elif knob.cli == "append":
        p.add_argument(knob.option, dest=knob.name, action="append", default=[], metavar=knob.metavar, help=knob.help)
    else:
        choices = ON_OFF if knob.cli == "on_off" else knob.choices or None
        shown = ("on" if default else "off") if knob.cli == "on_off" else default
        kind = {"int": int, "float": float}.get(knob.kind, str)
        p.add_argument(knob.option, dest=knob.name, type=kind, default=shown, choices=choices,
                       metavar=knob.metavar or None, help=help_text)


def config_from_args(a: argparse.Namespace, one_drafter: bool = False) -> RunConfig:
    """The RunConfig of ``add_run_args``'s flags (ConfigError for a value out of range). An
    unset ``--async`` / ``--no-async`` leaves the record's default: the front end decides.
    ``one_drafter`` (a command that runs one drafter): ConfigError for a flag set off its default
    that the drafter never reads, such as ``--mtp-layers`` for a draft model."""
    values = {knob.name: getattr(a, knob.name) for knob in KNOBS}
    unread = unread_knobs(values, values["drafter"]) if one_drafter else []
    if unread:
        raise ConfigError("; ".join(unread))
    return RunConfig().with_knobs({name: value for name, value in values.items() if value is not None
                                   or KNOB[name].kind == "path"})


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
