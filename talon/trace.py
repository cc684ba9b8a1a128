"""StepTrace and RunSummary: plain data (lists, numbers, strings; no tensors), JSON round-trip.

Figures are pure functions of these records, so a saved trace replays with no model loaded.
Per-node lists are indexed by node id; node 0 is the root (the last committed token).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

TRACE_FORMAT = "talon-trace/1"


@dataclass
class StepTrace:
    step: int
    # --- the draft tree, one entry per node (node 0 = root) ---
    tokens: list[int]
    texts: list[str]
    parents: list[int]
    depths: list[int]
    q_draft: list[float]
    path_conf: list[float]
    sources: list[str]  # "root" | "model" | "retrieval" | "both"
    gate_layer_max: list[float | None]
    gate_threshold: list[float | None]
    gate_passed: list[bool | None]  # None: the gate never looked at this node
    target_top1: list[int]  # target's argmax after each node
    # --- acceptance ---
    accepted: list[int]  # accepted node ids, root first
    bonus_token: int
    bonus_text: str
    new_tokens: list[int]  # tokens committed this step (accepted drafts + bonus)
    # Sampling only: per tried node, the target probability and the acceptance probability.
    p_target: list[float | None] = field(default_factory=list)
    p_accept: list[float | None] = field(default_factory=list)
    # --- time (seconds) ---
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    # --- async overlap: (start, end) seconds since the run started ---
    drafter_busy: list[tuple[float, float]] = field(default_factory=list)
    verifier_busy: list[tuple[float, float]] = field(default_factory=list)
    predraft_reused: bool | None = None
    # --- retrieval ---
    match_len: int = 0

    @property
    def accept_len(self) -> int:
        """Draft tokens accepted this step (the bonus token excluded)."""
        return len(self.accepted) - 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "StepTrace":
        known = {f.name for f in dataclasses.fields(StepTrace)}
        clean = {k: v for k, v in data.items() if k in known}
        for key in ("drafter_busy", "verifier_busy"):
            clean[key] = [tuple(x) for x in clean.get(key, [])]
        return StepTrace(**clean)


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
    config: dict[str, Any] = field(default_factory=dict)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    mean_tree_depth: float = 0.0
    mean_tree_width: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    stop_reason: str = ""

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
    widths = []
    for st in steps:
        counts: dict[int, int] = {}
        for d in st.depths[1:]:
            counts[d] = counts.get(d, 0) + 1
        widths.append(max(counts.values(), default=0))
    return {
        "mean_accepted_tokens": committed / n,
        "accepted_by_source": by_source,
        "mean_tree_depth": sum(max(st.depths) for st in steps) / n,
        "mean_tree_width": sum(widths) / n,
        "draft_s": sum(st.draft_s for st in steps),
        "verify_s": sum(st.verify_s for st in steps),
        "other_s": sum(st.other_s for st in steps),
    }


def dump_trace(path: str, summary: RunSummary, steps: list[StepTrace]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(
            {"format": TRACE_FORMAT, "summary": summary.to_dict(), "steps": [s.to_dict() for s in steps]},
            fh,
        )
