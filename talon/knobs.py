"""Every knob of a run, declared once: its name, type, range, default, help, where it lives in a
``RunConfig`` and what the app calls it; and the drafter kinds (``DRAFTERS``: which model drafts,
whether retrieval does, whether an atlas replays it).

One name per knob (``name``) serves the command line (``--name`` with dashes, unless ``flag``
says otherwise), the atlas grid, the benchmark's ``--talon-variant`` and the Threshold explorer.
The app's controls and its ``/generate`` API keep their public names (``app``); where that name
differs it is a documented alias (docs/app.md). From this table come the ``RunConfig`` records'
defaults and their checks (``check``), the command line's flags (``talon.cli.args``), the app's
controls (``talon.server.request``, ``talon.ui.panel``), the explorer's knobs
(``talon.atlas.explorer``), the atlas grid (``talon.atlas.sweep``) and docs/cli.md's flag table
(``markdown_table``). A value from outside (a slider's float, a command line's text) is read
once, by ``Knob.read``; a value inside a record is checked once, by ``Knob.check``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

# The drafter kinds, registered here and nowhere else. A kind says which model drafts (``model``) and
# whether retrieval from the text so far drafts too (``retrieval``); where a model drafts, the function
# that makes its DraftSource is ``talon.drafters.SOURCE_MAKERS[name]``. ``talon.drafters.tree_drafter.build_drafter``
# combines the source and retrieval under the budget and gates; how to add one: docs/design.md, "Add a drafter".
DrafterName = Literal["hybrid", "model", "retrieval", "layerskip", "eagle3", "eagle3-hybrid", "mtp", "mtp-hybrid",
                      "none"]
# which model drafts: "draft" (the pair's draft model), "head" (an EAGLE-3 head in the pair's draft slot, on the
# target's features), "target" (the target itself), "mtp" (the target's own MTP layers, on its last hidden state);
# None: no model
DraftingModel = Literal["draft", "head", "target", "mtp"]
# the drafting models that read the target's features, so cannot pre-draft during a verification
FEATURE_MODELS: tuple[DraftingModel, ...] = ("head", "mtp")


@dataclass(frozen=True)
class DrafterKind:
    name: DrafterName
    model: DraftingModel | None
    retrieval: bool  # retrieval from the text so far drafts too
    summary: str  # one line: --help, docs/cli.md, the app
    # an atlas (which records the draft slot's and retrieval's children) replays it: an atlas recorded with
    # a draft model replays the "draft" kinds, one recorded with an EAGLE-3 head the "head" kinds
    atlas: bool = True


DRAFTERS: dict[str, DrafterKind] = {k.name: k for k in (
    DrafterKind("hybrid", "draft", True, "the draft model's gated tree with retrieval grafted in (Talon)"),
    DrafterKind("model", "draft", False, "the draft model alone"),
    DrafterKind("retrieval", None, True, "retrieval from the text so far alone (a suffix automaton; no model)"),
    DrafterKind("layerskip", "target", False,
                "self-speculative: the target itself with some of its layers skipped drafts (no second model)",
                atlas=False),
    DrafterKind("eagle3", "head", False, "an EAGLE-3 head (--draft DIR): one decoder layer on the target's own "
                "features"),
    DrafterKind("eagle3-hybrid", "head", True, "an EAGLE-3 head's gated tree with retrieval grafted in"),
    DrafterKind("mtp", "mtp", False, "the target's own multi-token-prediction (MTP) layer, on its last hidden "
                "state (no draft model)"),
    DrafterKind("mtp-hybrid", "mtp", True, "the target's MTP layer's gated tree with retrieval grafted in"),
    DrafterKind("none", None, False, "nobody: the autoregressive baseline (one token a step)"),
)}
DRAFTER_KINDS: tuple[DrafterName, ...] = get_args(DrafterName)
if tuple(DRAFTERS) != DRAFTER_KINDS:
    raise ValueError(f"the drafter kinds' rows {tuple(DRAFTERS)} must follow DrafterName {DRAFTER_KINDS}")
# the kinds that draft
DRAFTING_KINDS: tuple[str, ...] = tuple(k for k, d in DRAFTERS.items() if d.model or d.retrieval)
HEAD_KINDS: tuple[str, ...] = tuple(k for k, d in DRAFTERS.items() if d.model == "head")  # an EAGLE-3 head drafts
MTP_KINDS: tuple[str, ...] = tuple(k for k, d in DRAFTERS.items() if d.model == "mtp")  # the target's MTP layer drafts
# the kinds an atlas recorded with a draft model replays, and those one recorded with an EAGLE-3 head replays
ATLAS_KINDS: tuple[str, ...] = tuple(k for k, d in DRAFTERS.items() if d.atlas and d.model in ("draft", None))
HEAD_ATLAS_KINDS: tuple[str, ...] = tuple(k for k, d in DRAFTERS.items() if d.atlas and d.model in ("head", None))
# and one recorded with the target's MTP layer drafting: mtp, mtp-hybrid, retrieval and none
MTP_ATLAS_KINDS: tuple[str, ...] = tuple(k for k, d in DRAFTERS.items() if d.atlas and d.model in ("mtp", None))
# a drafter kind's counterpart on an MTP atlas (the draft model's and a head's kinds map to the MTP layer's)
MTP_COUNTERPART: dict[str, str] = {"hybrid": "mtp-hybrid", "model": "mtp", "eagle3-hybrid": "mtp-hybrid",
                                   "eagle3": "mtp"}
# the kinds the app offers with a draft model in the pair's draft slot, and with an EAGLE-3 head there
MODEL_PAIR_KINDS: tuple[str, ...] = tuple(k for k in DRAFTING_KINDS if DRAFTERS[k].model in ("draft", "target", None))
HEAD_PAIR_KINDS: tuple[str, ...] = tuple(k for k in DRAFTING_KINDS if DRAFTERS[k].model in ("head", "target", None))
# the kinds that draft and that an atlas replays: hybrid and its two halves, the draft model and retrieval
ATLAS_DRAFTING_KINDS: tuple[str, ...] = tuple(k for k in DRAFTING_KINDS if k in ATLAS_KINDS)
# the same for an atlas recorded with an EAGLE-3 head: eagle3, eagle3-hybrid and retrieval
HEAD_ATLAS_DRAFTING_KINDS: tuple[str, ...] = tuple(k for k in DRAFTING_KINDS if k in HEAD_ATLAS_KINDS)
# and for an atlas recorded with the target's MTP layer: mtp, mtp-hybrid and retrieval
MTP_ATLAS_DRAFTING_KINDS: tuple[str, ...] = tuple(k for k in DRAFTING_KINDS if k in MTP_ATLAS_KINDS)
# a drafter kind's counterpart when the draft slot holds an EAGLE-3 head instead of a draft model
HEAD_COUNTERPART: dict[str, str] = {"hybrid": "eagle3-hybrid", "model": "eagle3"}


def slot_kind(head: bool, offered: tuple[str, ...], current: str) -> str:
    """The kind to show of ``offered`` for a draft slot holding a head (``head``) or a draft model:
    ``current`` where offered, else its counterpart (hybrid and eagle3-hybrid, model and eagle3),
    else the first."""
    if current in offered:
        return current
    swap = HEAD_COUNTERPART if head else {v: k for k, v in HEAD_COUNTERPART.items()}
    found = swap.get(current, offered[0])
    return found if found in offered else offered[0]


class ConfigError(ValueError):
    """A knob is out of range; the message names the knob, the value and the allowed range."""


TreeMode = Literal["adaptive", "static", "chain"]
Admission = Literal["calibrated", "confidence"]
CostMode = Literal["fixed", "learn"]
# how an engine's forwards run (a server setting, TALON_FORWARD, not a run knob): talon.graphs.static.resolve_forward
Forward = Literal["auto", "dynamic", "static", "graphs", "compiled"]
TREE_MODES: tuple[TreeMode, ...] = get_args(TreeMode)
ADMISSIONS: tuple[Admission, ...] = get_args(Admission)
COST_MODES: tuple[CostMode, ...] = get_args(CostMode)
FORWARDS: tuple[Forward, ...] = get_args(Forward)
# a knob's type: int | float | bool | choice | texts (a tuple of strings) | path (a file, or None)
KnobKind = Literal["int", "float", "bool", "choice", "texts", "path"]
# how the command line sets it: value | on_off | negate (--flag sets False) | pair (--flag / --no-flag; unset: the
# front end decides) | append
KnobCli = Literal["value", "on_off", "negate", "pair", "append"]
MtpLayerRule = Literal["reuse", "chained"]
MTP_LAYER_RULES: tuple[MtpLayerRule, ...] = ("reuse", "chained")  # which MTP layer drafts which depth
ON_OFF: tuple[str, ...] = ("on", "off")
MAX_BUDGET = 256  # draft nodes one verification may hold
BAR = "\\|"  # a | inside a markdown table
WORDS = {"on": True, "true": True, "off": False, "false": False}


@dataclass(frozen=True)
class Knob:
    name: str  # the one name: the flag (dashes), the grid key, the variant key, the explorer's
    path: str  # where it lives in a RunConfig: "tree.budget", "drafter"
    kind: KnobKind
    default: Any
    help: str  # the flag's help and docs/cli.md's meaning
    lo: float | None = None  # the range of an int or float, both ends included
    hi: float | None = None
    choices: tuple[str, ...] = ()
    said: str = ""  # what error messages call it (default: name)
    flag: str = ""  # the command line's flag (default: --name, dashes)
    cli: KnobCli = "value"
    metavar: str = ""
    app: str = ""  # the app's control and /generate parameter ("": not in the app)
    app_choices: tuple[str, ...] = ()  # where the app offers fewer choices
    slider: tuple[float, float, float] | None = None  # the app's slider: lo, hi, step
    label: str = ""  # the app's label
    grid: bool = False  # an atlas sweep may vary it
    explore: bool = False  # the Threshold explorer varies it
    bench: Any = None  # the benchmark's default, where it differs
    read_by: str = ""  # which drafter kinds read it (a READERS key; "": every kind)

    @property
    def section(self) -> str:
        """The RunConfig record it lives in ("" for RunConfig itself)."""
        return self.path.rpartition(".")[0]

    @property
    def field(self) -> str:
        return self.path.rpartition(".")[2]

    @property
    def option(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def words(self) -> str:
        return self.said or self.name

    def range_words(self) -> str:
        return f"[{self.lo}, {self.hi}]" if self.kind == "float" else f"[{int(self.lo)}, {int(self.hi)}]"  # type: ignore[arg-type]

    def check(self, value: Any) -> None:
        """ConfigError unless ``value`` is of the knob's type and in its range (a record's value)."""
        ok = True
        if self.kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool) and self.lo <= value <= self.hi  # type: ignore[operator]
            want = f"an integer in {self.range_words()}"
        elif self.kind == "float":
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
                  and self.lo <= float(value) <= self.hi)  # type: ignore[operator]
            want = f"a number in {self.range_words()}"
        elif self.kind == "bool":
            ok, want = isinstance(value, bool), "true or false"
        elif self.kind == "choice":
            ok, want = value in self.choices, f"one of {self.choices}"
        elif self.kind == "texts":
            ok = isinstance(value, tuple) and all(isinstance(s, str) and s for s in value)
            want = "non-empty strings"
        else:  # path
            ok, want = value is None or (isinstance(value, str) and bool(value)), "a file path or nothing"
        if not ok:
            raise ConfigError(f"{self.words} must be {want}, got {value!r}")

    def read(self, value: Any, app: bool = False, cap: float | None = None) -> Any:
        """The knob's value from the outside (a slider sends 12.0, a command line '12', a
        checkbox True, a flag 'on'), checked; ConfigError says what is wrong. ``app``: the
        app's narrower choices apply; ``cap``: a server's own upper bound."""
        if self.kind in ("int", "float"):
            if isinstance(value, str):
                with contextlib.suppress(ValueError):  # text that is no number is refused below, as given
                    value = float(value.strip()) if self.kind == "float" else int(value.strip())
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if self.kind == "int":
                if not number or value != int(value):
                    raise ConfigError(f"{self.words} must be an integer, got {value!r}")
                value = int(value)
            elif not number:
                raise ConfigError(f"{self.words} must be a number, got {value!r}")
            else:
                value = float(value)
        elif self.kind == "bool":
            if isinstance(value, str) and value.strip().lower() in WORDS:
                value = WORDS[value.strip().lower()]
            if not isinstance(value, bool):
                raise ConfigError(f"{self.words} must be true or false ('on' or 'off'), got {value!r}")
        elif self.kind == "choice":
            offered = self.app_choices if app and self.app_choices else self.choices
            if value not in offered:
                raise ConfigError(f"{self.words} must be one of {offered}, got {value!r}")
        elif self.kind == "texts":
            value = tuple(value) if isinstance(value, (list, tuple)) else value
        self.check(value)
        if cap is not None and value > cap:
            raise ConfigError(f"{self.words} must be at most {cap} on this server, got {value}")
        return value


# async drafting's one default and its one reason (the knob's help, the app's note, the settings' table)
ASYNC_OFF_WHY = ("it measured slower on a CPU, where the pre-draft takes the verifier's cores "
                 "(docs/runs/2026-11-22-cpu-async.md: humaneval 5.36 sync against 3.88 async tok/s); on a GPU "
                 "an in-line draft layer is a CUDA-graph replay (2.8 ms on an H100, "
                 "docs/runs/2026-11-26-h100-speed.md) while a pre-draft runs eagerly on its own thread, and "
                 "no GPU run has timed async drafting yet")

KNOBS: tuple[Knob, ...] = (
    Knob("drafter", "drafter", "choice", "hybrid", "who drafts (talon.knobs): "
         "hybrid = the draft model's gated tree with retrieval grafted in; model = the draft model alone; "
         "retrieval = retrieval from the text so far alone; layerskip = the target with some layers skipped "
         "(self-speculative, no second model); eagle3 = an EAGLE-3 head on the target's features (eagle3-hybrid: "
         "with retrieval); mtp = the target's own MTP layer (mtp-hybrid: with retrieval); "
         "none = nobody (the autoregressive baseline)",
         choices=DRAFTER_KINDS, app="drafter", app_choices=DRAFTING_KINDS, label="Drafter", grid=True, explore=True),
    Knob("tree", "tree.mode", "choice", "adaptive", "TALON's gated tree, EAGLE-2's static tree, or a single chain",
         choices=TREE_MODES, said="tree mode", app="tree_mode", label="Tree", grid=True, explore=True),
    Knob("budget", "tree.budget", "int", 16, "N: draft nodes verified per target forward, root excluded",
         1, MAX_BUDGET, metavar="N", app="budget", slider=(1, 128, 1), label="Budget N (nodes verified per step)",
         grid=True, explore=True),
    Knob("root_k", "tree.root_k", "int", 4, "K: children of the root; the root layer is never gated", 1, 64,
         metavar="K", app="root_k", slider=(1, 16, 1), label="Root K (children of the root)", grid=True, explore=True),
    Knob("top_k", "tree.top_k", "int", 2, "k: children per expanded node at depth >= 1", 1, 16, metavar="k",
         app="top_k", slider=(1, 8, 1), label="k (children per expanded node)", grid=True, explore=True),
    Knob("mu", "tree.mu", "float", 0.1, "the gate: a node expands only if its path confidence >= mu x the best "
         "in its layer", 0.0, 1.0, metavar="MU", app="mu", slider=(0.0, 1.0, 0.01),
         label="Gate μ (expand if c ≥ μ × layer max)", grid=True, explore=True),
    Knob("max_depth", "tree.max_depth", "int", 8, "the deepest layer; a chain drafts min(N, D) tokens", 1, 64,
         metavar="D", app="max_depth", slider=(1, 32, 1), label="Max depth", grid=True, explore=True),
    Knob("min_conf", "tree.min_conf", "float", 0.2, "cost stop: expand a layer only while its best path "
         "confidence is >= C (each layer is one draft forward; 0 = off)", 0.0, 1.0, metavar="C", app="min_conf",
         slider=(0.0, 1.0, 0.01), label="Min confidence (stop deepening below it; 0 = off)", grid=True,
         explore=True),
    Knob("cost_aware", "tree.cost_aware", "bool", True, "goodput planning: a measured cost model (verify time "
         "against tree size, draft time per layer; probed once per pair and host, cached, see --cost-model) and "
         "an acceptance model calibrated per source stop the tree when the next layer does not pay, trim "
         "unprofitable nodes, and skip the draft model (and its prompt prefill) on steps where retrieval alone "
         "is expected to be faster; off = pure TALON budget fill", cli="on_off", app="cost_aware",
         label="Cost-aware (stop the tree when the next layer does not pay on this hardware; skip the draft "
         "model when retrieval alone is faster)", grid=True, explore=True),
    Knob("admission", "tree.admission", "choice", "calibrated", "what ranks the nodes competing for the budget "
         "(adaptive and static trees): calibrated = the acceptance model's P(node accepted), learnt per source "
         "during the run; confidence = the raw path confidence, as in TALON and EAGLE-2", choices=ADMISSIONS,
         grid=True),
    Knob("cost_model", "cost_model", "choice", "learn", "how planning uses the measured curves: fixed = on the "
         "snapshot read at start (probe or cache) and on predicted times only, so the same command on the same "
         "host gives the same trees; learn = this run refines its own copy from its step timings (sampled runs "
         "always plan fixed; the benchmark's default is fixed)", choices=COST_MODES, bench="fixed"),
    Knob("retrieval_min_match", "retrieval.min_match", "int", 2, "retrieval: the shortest suffix match that "
         "proposes at all", 1, 64, metavar="L", slider=(1, 16, 1), grid=True, explore=True, read_by="retrieval"),
    Knob("retrieval_max_continuation", "retrieval.max_continuation", "int", 16, "retrieval: the longest "
         "continuation drafted from one match", 1, 128, metavar="L", grid=True, read_by="retrieval"),
    Knob("graft_threshold", "retrieval.graft_threshold", "int", 3, "hybrid: graft the retrieval trie when its "
         "match has at least L tokens", 1, 64, metavar="L", app="retrieval_threshold", slider=(1, 16, 1),
         label="Retrieval threshold (match length to graft)", grid=True, explore=True, read_by="graft"),
    Knob("retrieval_branches", "retrieval.max_branches", "int", 2, "retrieval: continuations (distinct next "
         "tokens) kept per trie node", 1, 16, metavar="B", grid=True, read_by="retrieval"),
    Knob("corpus", "retrieval.corpus", "path", None, "a static retrieval datastore: a .jsonl (fields turns, "
         "text or prompt) or text file", metavar="PATH", read_by="retrieval"),
    Knob("skip_layers", "skip_layers", "float", 0.3, "layerskip: the share of the target's layers its draft "
         "skips (one block in the middle of the depth; the first and last layers always run)", 0.05, 0.9,
         metavar="F", app="skip_layers", slider=(0.05, 0.9, 0.05), label="Layers skipped (layerskip drafter)",
         grid=False, read_by="layerskip"),
    Knob("temperature", "sampling.temperature", "float", 0.0, "sampling temperature; 0 = greedy", 0.0, 10.0,
         metavar="T", app="temperature", slider=(0.0, 2.0, 0.05), label="Temperature (0 = greedy)"),
    Knob("top_p", "sampling.top_p", "float", 1.0, "sampling: nucleus top-p (1 = off)", 1e-6, 1.0, metavar="P",
         app="top_p", slider=(0.05, 1.0, 0.05), label="Top-p"),
    Knob("sample_top_k", "sampling.top_k", "int", 0, "sampling: top-k (0 = off); --top-k is the tree's k", 0,
         1_000_000, metavar="K"),
    Knob("seed", "sampling.seed", "int", 0, "sampling seed", 0, 2**63 - 1, metavar="S", app="seed", label="Seed"),
    Knob("max_new_tokens", "max_new_tokens", "int", 128, "the most tokens a run generates", 1, 1_000_000,
         metavar="N", app="max_new_tokens", label="Max new tokens", grid=True),
    Knob("stop", "stop_strings", "texts", (), "a stop string (repeatable)", cli="append", metavar="STR"),
    Knob("chat_template", "chat_template", "bool", True, "wrap the prompt in the tokenizer's chat template",
         flag="--no-chat-template", cli="negate"),
    Knob("async_draft", "async_draft", "bool", False, "pre-draft the next tree on a second thread while the "
         f"target verifies (default off on every device: {ASYNC_OFF_WHY})", flag="--async",
         cli="pair", app="async_draft", label="Async drafting (draft the next tree while verifying)"),
    Knob("mtp_layers", "mtp_layers", "choice", "reuse", "mtp: which of the target's MTP layers drafts which "
         "depth. reuse = layer 0 at every depth (vLLM V1's and SGLang's rule); chained = layer k drafts depth "
         "k + 1 on layer k - 1's output, as transformers and vLLM V2 run a checkpoint of several layers (the tree "
         "is then at most that many levels deep)", choices=MTP_LAYER_RULES, metavar="RULE", read_by="mtp"),
    Knob("draft_vocab", "draft_vocab", "int", 32768, "draft logits over the first V token ids only (BPE ids are "
         "roughly frequency-ranked; 0 = the full vocabulary)", 0, 10_000_000, metavar="V"),
)
KNOB: dict[str, Knob] = {k.name: k for k in KNOBS}
APP_KNOBS: tuple[Knob, ...] = tuple(k for k in KNOBS if k.app)
BY_APP: dict[str, Knob] = {k.app: k for k in APP_KNOBS}
EXPLORER_KNOBS: tuple[Knob, ...] = tuple(k for k in KNOBS if k.explore)
GRID_KNOBS: tuple[Knob, ...] = tuple(k for k in KNOBS if k.grid)
# which drafter kinds read a knob tagged ``read_by``
READERS: dict[str, Callable[[DrafterKind], bool]] = {
    "retrieval": lambda d: d.retrieval,
    "graft": lambda d: d.retrieval and d.model is not None,  # the hybrids
    "layerskip": lambda d: d.model == "target",
    "mtp": lambda d: d.model == "mtp",
}
if {k.read_by for k in KNOBS} - {"", *READERS}:
    raise ValueError(f"a knob's read_by is none of {tuple(READERS)}")


def unread_knobs(values: Mapping[str, Any], drafter: str) -> list[str]:
    """The knobs in ``{knob name: value}`` set off their defaults that ``drafter`` never reads,
    each in an error's words: a flag that would change nothing."""
    kind = DRAFTERS[drafter]
    unread = []
    for name, value in values.items():
        knob = KNOB[name]
        reads = READERS.get(knob.read_by)
        if reads is not None and value not in (None, knob.default) and not reads(kind):
            names = ", ".join(d.name for d in DRAFTERS.values() if reads(d))
            unread.append(f"{knob.option} {value} changes nothing with --drafter {drafter}: only {names} read it")
    return unread


def default(path: str) -> Any:
    """The default of the knob at ``path`` (the records' field defaults)."""
    return next(k.default for k in KNOBS if k.path == path)


def check_record(record: Any, section: str) -> None:
    """Check every knob that lives in ``record`` (a RunConfig, or its ``section`` record)."""
    for knob in KNOBS:
        if knob.section == section:
            knob.check(getattr(record, knob.field))


def values_of(config: Mapping[str, Any]) -> dict[str, Any]:
    """Every knob's value in ``config`` (a RunConfig as a dict, perhaps partial: a trace's
    ``summary.config``); what it does not hold keeps the knob's default."""
    out = {}
    for knob in KNOBS:
        where: Any = config.get(knob.section) or {} if knob.section else config
        out[knob.name] = where.get(knob.field, knob.default)
    return out


def nested(values: Mapping[str, Any], app: bool = False, caps: Mapping[str, float] | None = None) -> dict[str, Any]:
    """``{name: value}`` read (``Knob.read``) and laid out as a RunConfig dict (the sections
    nested), for ``RunConfig.with_knobs``; ConfigError names an unknown knob."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name not in KNOB:
            raise ConfigError(f"unknown knob {name!r}; the knobs are {', '.join(KNOB)}")
        knob = KNOB[name]
        where = out.setdefault(knob.section, {}) if knob.section else out
        where[knob.field] = knob.read(value, app, (caps or {}).get(name))
    return out


def markdown_table() -> str:
    """docs/cli.md's table of the run's flags (a test holds the docs to it)."""
    rows = ["| flag | meaning (default) |", "| --- | --- |"]
    for knob in KNOBS:
        if knob.cli == "pair":
            flag = f"`{knob.option}` / `--no-{knob.option[2:]}`"
        elif knob.cli == "negate":
            flag = f"`{knob.option}`"
        elif knob.choices or knob.cli == "on_off":
            flag = f"`{knob.option} {BAR.join(knob.choices or ON_OFF)}`"
        else:
            flag = f"`{knob.option} {knob.metavar or knob.name.upper()}`"
        shown = {True: "on", False: "off", None: "none", (): "none"}.get(knob.default, knob.default) \
            if not isinstance(knob.default, (int, float)) or isinstance(knob.default, bool) else knob.default
        bound = f"; {knob.range_words()}" if knob.kind in ("int", "float") else ""
        alias = f"; the app's `{knob.app}`" if knob.app and knob.app != knob.name else ""
        rows.append(f"| {flag} | {knob.help} ({shown}{bound}{alias}) |")
    return "\n".join(rows)
