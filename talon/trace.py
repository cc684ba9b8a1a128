"""StepTrace and RunSummary: plain data (lists, numbers, strings; no tensors), JSON round-trip.

Figures are pure functions of these records, so a saved trace replays with no model loaded.
Per-node lists are indexed by node id; node 0 is the root (the last committed token).

This module owns the ``talon-trace/1`` file format: ``dump_trace`` writes it, and
``read_json_upload`` then ``parse_trace`` read it back, validated field by field (never
eval'd); a malformed file raises ``TraceFileError`` with a message that says what is wrong.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from talon.tree import TRACE_SOURCES, layer_width

TRACE_FORMAT = "talon-trace/1"
MAX_UPLOAD_BYTES = 20 * 1024 * 1024  # trace and results.json uploads
MAX_TRACE_STEPS = 100_000
MAX_TREE_NODES = 4096


BonusKind = Literal["bonus", "resampled"]
# why a run stopped: its token limit, an EOS token, a stop string, or the user
StopReason = Literal["max_new_tokens", "eos", "stop_string", "cancelled"]


# A step's record comes in four parts, each a dataclass of its own fields; StepTrace is all four
# (``StepTrace.from_parts``), flat, so its JSON is the same as before the parts had names.


@dataclass(kw_only=True)
class TreeRecord:
    """The step's draft tree, one entry per node (node 0 = root), and why it stopped growing."""

    tokens: list[int]
    texts: list[str]
    parents: list[int]
    depths: list[int]
    q_draft: list[float]
    path_conf: list[float]
    sources: list[str]  # "root" | "model" | "head" (an EAGLE-3 head's) | "mtp" (an MTP layer's) | "retrieval" | "both"
    gate_layer_max: list[float | None]
    gate_threshold: list[float | None]
    gate_passed: list[bool | None]  # None: the gate never looked at this node
    tree_stop: str = ""  # why the tree stopped growing: a talon.tree.TreeStop ("" in older traces)


@dataclass(kw_only=True)
class VerdictRecord:
    """What the target said of the tree and what the step committed."""

    target_top1: list[int]  # target's argmax after each node
    accepted: list[int]  # accepted node ids, root first
    bonus_token: int
    bonus_text: str
    new_tokens: list[int]  # tokens committed this step (accepted drafts + bonus), cut at a stop
    # Sampling only: per tried node, the target probability and the acceptance probability.
    p_target: list[float | None] = field(default_factory=list)
    p_accept: list[float | None] = field(default_factory=list)
    # The node inspector: the target's top 5 after each node (its sampling distribution under
    # sampling, else the softmax of its logits), and each node's position id (prefix length +
    # depth: siblings share it)
    target_topk_ids: list[list[int]] = field(default_factory=list)
    target_topk_probs: list[list[float]] = field(default_factory=list)
    target_topk_texts: list[list[str]] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    # "bonus": the last token was drawn after a path that ran to a leaf; "resampled": it replaces
    # a rejected draft child (under sampling drawn from the residual, whose top 5 is recorded)
    bonus_kind: BonusKind = "bonus"
    residual_topk: list[tuple[int, float]] = field(default_factory=list)


@dataclass(kw_only=True)
class StepTiming:
    """One step's times, in seconds: measured by the clock in a run, predicted by the cost model
    in a replay. The busy spans are (start, end) since the run started, for the timeline."""

    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    drafter_busy: list[tuple[float, float]] = field(default_factory=list)
    verifier_busy: list[tuple[float, float]] = field(default_factory=list)
    predicted_verify_s: float | None = None  # the cost model's verify time for this tree (planned runs)


@dataclass(kw_only=True)
class PlanRecord:
    """How the step's draft was made: retrieval's match, the planner's decisions, the pre-draft."""

    match_len: int = 0  # retrieval's match length
    model_skipped: str = ""  # why the draft model did not run this step ("" = it ran / absent)
    trimmed: int = 0  # nodes cut by the goodput trim
    draft_forwards: int = 0  # draft-model forwards this step (catch-up included)
    p_accept_est: list[float] = field(default_factory=list)  # the acceptance model's P(node accepted), per node
    predraft_reused: bool | None = None  # None: nothing was pre-drafted; False: the pre-draft's bet missed


@dataclass(kw_only=True)
class StepTrace(PlanRecord, StepTiming, VerdictRecord, TreeRecord):
    """One step of a run: its number and its four parts' fields, flat."""

    step: int

    @staticmethod
    def from_parts(step: int, tree: TreeRecord, verdict: VerdictRecord, timing: StepTiming,
                   plan: PlanRecord) -> StepTrace:
        return StepTrace(step=step, **vars(tree), **vars(verdict), **vars(timing), **vars(plan))

    @property
    def timing(self) -> StepTiming:
        return StepTiming(**{f.name: getattr(self, f.name) for f in dataclasses.fields(StepTiming)})

    @property
    def accept_len(self) -> int:
        """Draft tokens accepted this step (the bonus token excluded)."""
        return len(self.accepted) - 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> StepTrace:
        known = {f.name for f in dataclasses.fields(StepTrace)}
        clean = {k: v for k, v in data.items() if k in known}
        for key in ("drafter_busy", "verifier_busy", "residual_topk"):
            clean[key] = [tuple(x) for x in clean.get(key, [])]
        return StepTrace(**clean)


@dataclass(frozen=True)
class RunModels:
    """Which models a run used, as its summary names them."""

    target: str
    draft: str
    dtype: str
    device: str
    forward_path: str = ""  # Engine.forward_path: how the forwards ran


@dataclass
class RunSummary:
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    steps: int
    mean_accepted_tokens: float
    tokens_per_second: float
    seconds: float
    target: str = ""
    draft: str = ""
    dtype: str = ""
    device: str = ""
    forward_path: str = ""  # how the forwards ran (talon.engine.engine.Engine.forward_path: dynamic+fold, graphs, ...)
    config: dict[str, Any] = field(default_factory=dict)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    mean_tree_depth: float = 0.0
    mean_tree_width: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    stop_reason: StopReason | Literal[""] = ""
    draft_forwards: int = 0
    model_skips: int = 0  # steps on which the draft model did not run
    tree_stops: dict[str, int] = field(default_factory=dict)  # why trees stopped, counted
    cost_model: dict[str, Any] = field(default_factory=dict)  # talon-cost/1 curves after the run
    serving_metrics: dict[str, Any] = field(default_factory=dict)  # see serving_metrics()
    prompt: str = ""  # the prompt as the user gave it (before any chat template)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def summarize_steps(steps: list[StepTrace]) -> dict[str, Any]:
    """Run-level aggregates of a list of steps (MAT, per-source acceptance, tree shape)."""
    by_source: dict[str, int] = {"model": 0, "retrieval": 0, "both": 0, "bonus": 0}
    for st in steps:
        for node in st.accepted[1:]:
            by_source[st.sources[node]] = by_source.get(st.sources[node], 0) + 1
        by_source["bonus"] += 1
    n = max(len(steps), 1)
    committed = sum(len(st.new_tokens) for st in steps)
    widths = [layer_width(st.depths) for st in steps]
    return {
        "mean_accepted_tokens": committed / n,
        "accepted_by_source": by_source,
        "mean_tree_depth": sum(max(st.depths) for st in steps) / n,
        "mean_tree_width": sum(widths) / n,
        "draft_s": sum(st.draft_s for st in steps),
        "verify_s": sum(st.verify_s for st in steps),
        "other_s": sum(st.other_s for st in steps),
        "draft_forwards": sum(st.draft_forwards for st in steps),
        "model_skips": sum(1 for st in steps if st.model_skipped),
        "tree_stops": _count(st.tree_stop for st in steps if st.tree_stop),
        "serving_metrics": serving_metrics([st.accept_len for st in steps], [len(st.tokens) - 1 for st in steps]),
    }


def serving_metrics(accept_lens: list[int], draft_sizes: list[int]) -> dict[str, Any]:
    """Acceptance in the terms serving engines report (vLLM's spec-decode metrics; SGLang's
    "accept length" is the same mean acceptance length), from each verification step's accepted
    draft tokens and drafted nodes. Steps that drafted nothing are not drafts.

    * ``num_drafts``: steps that verified at least one draft token;
    * ``num_draft_tokens`` / ``num_accepted_tokens``: draft tokens verified / accepted;
    * ``mean_acceptance_length``: 1 + accepted / drafts (tokens per draft step, bonus included);
    * ``per_position_acceptance_rate``: for position i (depth i + 1), the share of drafts whose
      accepted prefix reached it.
    """
    drafted = [(a, n) for a, n in zip(accept_lens, draft_sizes) if n > 0]
    num_drafts = len(drafted)
    accepted = sum(a for a, _ in drafted)
    deepest = max((a for a, _ in drafted), default=0)
    return {
        "num_drafts": num_drafts,
        "num_draft_tokens": sum(n for _, n in drafted),
        "num_accepted_tokens": accepted,
        "mean_acceptance_length": 1.0 + accepted / num_drafts if num_drafts else 1.0,
        "per_position_acceptance_rate": [
            sum(1 for a, _ in drafted if a > i) / num_drafts for i in range(deepest)
        ],
    }


def _count(values: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def dump_trace(path: str, summary: RunSummary, steps: list[StepTrace]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(
            {"format": TRACE_FORMAT, "summary": summary.to_dict(), "steps": [s.to_dict() for s in steps]},
            fh,
        )


# ---------------------------------------------------------------------------------------------
# Reading a trace file back (validated, never eval'd)
# ---------------------------------------------------------------------------------------------


class TraceFileError(ValueError):
    """An uploaded file is not a usable trace or results file; the message says what is wrong."""


def read_json_upload(path: str | Path) -> Any:
    """Parse an uploaded JSON file after a size check; errors say what is wrong."""
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_UPLOAD_BYTES:
        raise TraceFileError(f"the file is {size / 2**20:.1f} MB; the limit is {MAX_UPLOAD_BYTES // 2**20} MB")
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as error:
        raise TraceFileError(f"the file is not UTF-8 text ({error.reason} at byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise TraceFileError(
            f"the file is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}"
        ) from None
    except RecursionError:
        raise TraceFileError("the file's JSON is nested too deeply to be a trace") from None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# field -> check of each element (for per-node lists) or of the value
_NODE_FIELDS: dict[str, Callable[[Any], bool]] = {
    "tokens": _is_int,
    "texts": lambda v: isinstance(v, str),
    "parents": _is_int,
    "depths": _is_int,
    "q_draft": is_number,
    "path_conf": is_number,
    "sources": lambda v: v in TRACE_SOURCES,
    "gate_layer_max": lambda v: v is None or is_number(v),
    "gate_threshold": lambda v: v is None or is_number(v),
    "gate_passed": lambda v: v is None or isinstance(v, bool),
    "target_top1": _is_int,
}
_TOPK_LEN = 64
# per-node fields that older traces lack; when present, one entry per node
_OPTIONAL_NODE_FIELDS: dict[str, Callable[[Any], bool]] = {
    "target_topk_ids": lambda v: isinstance(v, list) and len(v) <= _TOPK_LEN and all(_is_int(x) for x in v),
    "target_topk_probs": lambda v: isinstance(v, list) and len(v) <= _TOPK_LEN
    and all(is_number(x) and 0.0 <= x <= 1.0 for x in v),
    "target_topk_texts": lambda v: isinstance(v, list) and len(v) <= _TOPK_LEN
    and all(isinstance(x, str) and len(x) <= 256 for x in v),
    "positions": _is_int,
    "p_accept_est": is_number,
}
_SCALAR_FIELDS: dict[str, Callable[[Any], bool]] = {
    "step": _is_int,
    "bonus_token": _is_int,
    "bonus_text": lambda v: isinstance(v, str),
    "draft_s": is_number,
    "verify_s": is_number,
    "other_s": is_number,
    "match_len": _is_int,
    "predraft_reused": lambda v: v is None or isinstance(v, bool),
    "tree_stop": lambda v: isinstance(v, str) and len(v) <= 64,
    "model_skipped": lambda v: isinstance(v, str) and len(v) <= 1000,
    "trimmed": _is_int,
    "draft_forwards": _is_int,
    "predicted_verify_s": lambda v: v is None or is_number(v),
    "bonus_kind": lambda v: v in get_args(BonusKind),
}
_LIST_FIELDS: dict[str, Callable[[Any], bool]] = {
    "accepted": _is_int,
    "new_tokens": _is_int,
    "p_target": lambda v: v is None or is_number(v),
    "p_accept": lambda v: v is None or is_number(v),
    "drafter_busy": lambda v: isinstance(v, list) and len(v) == 2 and all(is_number(x) for x in v),
    "verifier_busy": lambda v: isinstance(v, list) and len(v) == 2 and all(is_number(x) for x in v),
    "residual_topk": lambda v: isinstance(v, list) and len(v) == 2 and _is_int(v[0]) and is_number(v[1]),
}
_OPTIONAL = {
    "p_target",
    "p_accept",
    "draft_s",
    "verify_s",
    "other_s",
    "drafter_busy",
    "verifier_busy",
    "predraft_reused",
    "match_len",
    "tree_stop",
    "model_skipped",
    "trimmed",
    "draft_forwards",
    "predicted_verify_s",
    "bonus_kind",
    "residual_topk",
}


def _check_fields(data: dict, where: str) -> None:
    for name, ok in {**_NODE_FIELDS, **_LIST_FIELDS}.items():
        if name not in data:
            if name in _OPTIONAL:
                continue
            raise TraceFileError(f"{where}: missing field {name!r}")
        value = data[name]
        if not isinstance(value, list) or not all(ok(v) for v in value):
            raise TraceFileError(f"{where}: field {name!r} must be a list of valid entries")
    for name, ok in _OPTIONAL_NODE_FIELDS.items():
        value = data.get(name, [])
        if not isinstance(value, list) or not all(ok(v) for v in value):
            raise TraceFileError(f"{where}: field {name!r} must be a list of valid entries")
    for name, ok in _SCALAR_FIELDS.items():
        if name in data and not ok(data[name]):
            raise TraceFileError(f"{where}: field {name!r} has an invalid value")
        if name not in data and name not in _OPTIONAL:
            raise TraceFileError(f"{where}: missing field {name!r}")


def _check_tree(data: dict, where: str) -> None:
    n = len(data["tokens"])
    if not 1 <= n <= MAX_TREE_NODES:
        raise TraceFileError(f"{where}: the tree must have 1 to {MAX_TREE_NODES} nodes, has {n}")
    if any(len(data[name]) != n for name in _NODE_FIELDS) or any(
        data.get(name) and len(data[name]) != n for name in _OPTIONAL_NODE_FIELDS
    ):
        raise TraceFileError(f"{where}: the per-node lists must all have {n} entries")
    positions = data.get("positions")
    if positions and any(positions[i] != positions[0] + depths_i for i, depths_i in enumerate(data["depths"])):
        raise TraceFileError(f"{where}: 'positions' must be the root's position plus each node's depth")
    parents, depths = data["parents"], data["depths"]
    if (
        parents[0] != -1
        or depths[0] != 0
        or any(not 0 <= parents[i] < i or depths[i] != depths[parents[i]] + 1 for i in range(1, n))
    ):
        raise TraceFileError(f"{where}: parents/depths do not describe a tree rooted at node 0")
    accepted = data["accepted"]
    if (
        not accepted
        or accepted[0] != 0
        or any(not 0 < a < n or parents[a] != b for b, a in zip(accepted, accepted[1:]))
    ):
        raise TraceFileError(f"{where}: 'accepted' must be a root-to-node path of the tree")
    if not 1 <= len(data["new_tokens"]) <= len(accepted):
        raise TraceFileError(f"{where}: 'new_tokens' must hold 1 to {len(accepted)} tokens")


def parse_step(data: Any, index: int) -> StepTrace:
    where = f"step {index}"
    if not isinstance(data, dict):
        raise TraceFileError(f"{where} must be a JSON object")
    _check_fields(data, where)
    _check_tree(data, where)
    return StepTrace.from_dict(data)


def parse_summary(data: Any, steps: list[StepTrace]) -> RunSummary:
    """A RunSummary from the file's summary when it is well formed, else rebuilt from the steps."""
    fields = {f.name: f for f in dataclasses.fields(RunSummary)}
    if isinstance(data, dict) and "forward_path" not in data:  # a file from before the renames: forward, earlier step
        old = data.get("forward", data.get("step"))
        data = {**data, "forward_path": old} if isinstance(old, str) else data
    known = {k: v for k, v in data.items() if k in fields} if isinstance(data, dict) else {}
    agg = summarize_steps(steps)
    tokens = [t for st in steps for t in st.new_tokens]
    base = dict(
        text="", token_ids=tokens, prompt_token_ids=[], steps=len(steps), tokens_per_second=0.0, seconds=0.0, **agg
    )
    for key, value in known.items():
        default = base.get(key, getattr(RunSummary, key, None))
        if default is None or isinstance(value, type(default)) or (isinstance(default, float) and is_number(value)):
            base[key] = value
    return RunSummary(**base)


def parse_trace(data: Any, tick: Callable[[], None] | None = None) -> tuple[RunSummary, list[StepTrace]]:
    """Validate a talon-trace/1 document (already JSON-parsed) and rebuild its records; ``tick``
    is called before each step (a model-free call's ``talon.atlas.budget.checkpoint``)."""
    if not isinstance(data, dict) or data.get("format") != TRACE_FORMAT:
        raise TraceFileError(f'not a Talon trace: expected a JSON object with "format": "{TRACE_FORMAT}"')
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list) or not 1 <= len(raw_steps) <= MAX_TRACE_STEPS:
        raise TraceFileError(f"'steps' must be a list of 1 to {MAX_TRACE_STEPS} steps")
    steps = []
    for i, s in enumerate(raw_steps):
        if tick is not None:
            tick()
        steps.append(parse_step(s, i))
    return parse_summary(data.get("summary"), steps), steps
