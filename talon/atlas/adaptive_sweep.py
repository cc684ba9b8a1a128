"""The adaptive draft-length rules side by side on atlases: ``talon atlas sweep ATLAS --grid
rule=talon,fixed,hf-heuristic,...``, each rule at its own knobs' defaults unless a grid key of
its own moves them, ranked by predicted tokens/s on the atlases' cost curves.

``talon`` is TALON's confidence-gated tree over the draft alone (its default knobs, planned on the
atlas's snapshot); every other rule drafts the draft's greedy chain (``talon.atlas.adaptive``).
Rules whose state outlives a request (transformers' ``heuristic``, SGLang's controller, the
llama.cpp streak) see the atlases in the order given, as one server's requests.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from talon.atlas.adaptive import (
    FixedChain,
    LengthRule,
    LengthRun,
    LlamaCppStreak,
    SglangAdaptive,
    VllmDynamicK,
    replay_requests,
)
from talon.atlas.adaptive_hf import HfAssisted
from talon.atlas.data import Atlas
from talon.atlas.replay import replay
from talon.atlas.result import for_slot
from talon.run_config import ConfigError, RunConfig


def _steps(value: str) -> tuple[int, ...]:
    return tuple(int(v) for v in value.split(":"))


def _table(value: str) -> tuple[tuple[int, int, int], ...]:
    """``1-16:3+17-64:2``: vLLM's ranges start-end:K."""
    out = []
    for part in value.split("+"):
        span, k = part.split(":")
        start, end = span.split("-")
        out.append((int(start), int(end), int(k)))
    return tuple(out)


# each rule's knobs: grid key -> how a value reads (the rule's constructor takes the same name)
RULE_KNOBS: dict[str, dict[str, Callable[[str], Any]]] = {
    "talon": {},
    "fixed": {"k": int},
    "hf-heuristic": {"num_assistant_tokens": int, "confidence": float},
    "hf-heuristic-transient": {"num_assistant_tokens": int, "confidence": float},
    "hf-confidence": {"num_assistant_tokens": int, "confidence": float},
    "sglang-adaptive": {"candidate_steps": _steps, "ema_alpha": float, "warmup_batches": int,
                        "update_interval": int, "down_hysteresis": float, "up_hysteresis": float},
    "vllm-dsd": {"k": int, "table": _table, "batch_size": int},
    "llamacpp-streak": {"n_max": int, "n_min": int, "threshold_n": int, "bias": int},
}
RULES: tuple[str, ...] = tuple(RULE_KNOBS)
RULE_GRID_KEYS: tuple[str, ...] = ("rule", *dict.fromkeys(k for knobs in RULE_KNOBS.values() for k in knobs))
HF_ARGS = {"confidence": "assistant_confidence_threshold"}  # a knob -> transformers' own name for it
HF_SCHEDULE = {"hf-heuristic": "heuristic", "hf-heuristic-transient": "heuristic_transient",
               "hf-confidence": "constant"}


def make_rule(name: str, knobs: dict[str, Any]) -> LengthRule:
    """The rule ``name`` with ``knobs`` (those it does not take are ignored)."""
    if name not in RULE_KNOBS or name == "talon":
        raise ConfigError(f"a chain rule is one of {', '.join(RULES[1:])}, got {name!r}")
    own = {k: v for k, v in knobs.items() if k in RULE_KNOBS[name]}
    if name in HF_SCHEDULE:
        return HfAssisted(HF_SCHEDULE[name], **own)
    kind = {"fixed": FixedChain, "sglang-adaptive": SglangAdaptive, "vllm-dsd": VllmDynamicK,
            "llamacpp-streak": LlamaCppStreak}[name]
    return kind(**own)


def parse_rule_grid(items: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """``rule=A,B`` and the rules' knobs ``KEY=V1,V2`` -> (rule, knobs) points: each rule crossed
    with the grid keys it takes, at its defaults for the rest (ConfigError names a bad item)."""
    grid: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not values or key not in RULE_GRID_KEYS:
            raise ConfigError(f"--grid {item!r}: with rule=, a key is one of {', '.join(RULE_GRID_KEYS)}")
        grid[key] = [v.strip() for v in values.split(",") if v.strip()]
    names = grid.pop("rule", list(RULES))
    if bad := [n for n in names if n not in RULE_KNOBS]:
        raise ConfigError(f"unknown rule(s) {', '.join(bad)}: choose from {', '.join(RULES)}")
    points = []
    for name in dict.fromkeys(names):
        keys = [k for k in grid if k in RULE_KNOBS[name]]
        try:
            values = [[RULE_KNOBS[name][k](v) for v in grid[k]] for k in keys]
        except ValueError as error:
            raise ConfigError(f"--grid for {name}: {error}") from None
        points += [(name, dict(zip(keys, combo))) for combo in itertools.product(*values)]
    for name, knobs in points:
        if name != "talon":
            make_rule(name, knobs)  # ConfigError now, not in the middle of a sweep
    return points


@dataclass
class RuleRow:
    """One rule at one setting over every atlas."""

    rule: str
    knobs: dict[str, Any]
    tokens: int
    steps: int
    predicted_s: float
    drafted: int = 0
    accepted: int = 0
    misses: int = 0
    near_ties: int = 0
    setting: dict[str, Any] = field(default_factory=dict)  # the knobs as given to ``make_rule`` (the rest default)
    lengths: list[list[int]] = field(default_factory=list)  # per atlas: the length each step drafted
    oracle: list[list[int]] = field(default_factory=list)  # per atlas: what the target would accept each step

    @property
    def mat(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.predicted_s if self.predicted_s > 0 else 0.0

    def label(self) -> str:
        knobs = ", ".join(f"{k}={v}" for k, v in self.knobs.items())
        return f"{self.rule} ({knobs})" if knobs else self.rule

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "knobs": self.knobs, "mat": self.mat, "tokens_per_second": self.tokens_per_s,
                "tokens": self.tokens, "steps": self.steps, "predicted_s": self.predicted_s,
                "drafted": self.drafted, "accepted": self.accepted, "misses": self.misses,
                "near_ties": self.near_ties}


def talon_row(atlases: Sequence[Atlas], cfg: RunConfig) -> RuleRow:
    """TALON at ``cfg`` (its drafter as the atlas replays it, at the atlas's draft vocabulary),
    planned fixed, over the recorded text."""
    row = RuleRow("talon", {}, 0, 0, 0.0)
    for atlas in atlases:
        result = replay(atlas, for_slot(atlas, cfg.replace(
            max_new_tokens=len(atlas.output), cost_model="fixed",
            draft_vocab=int(atlas.models.get("draft_vocab", cfg.draft_vocab)))))
        steps = result.steps
        row.tokens += len(result.summary.token_ids)
        row.steps += len(steps)
        row.predicted_s += result.predicted_s
        row.misses += result.coverage.misses
        row.drafted += sum(len(s.tokens) - 1 for s in steps)
        row.accepted += sum(len(s.new_tokens) - 1 for s in steps)
        row.lengths.append([len(s.tokens) - 1 for s in steps])
        row.oracle.append([])
    return row


def chain_row(atlases: Sequence[Atlas], name: str, knobs: dict[str, Any]) -> RuleRow:
    rule = make_rule(name, knobs)
    runs: list[LengthRun] = replay_requests(atlases, rule)
    row = RuleRow(name, rule.knobs(), 0, 0, 0.0, setting=dict(knobs))
    for run in runs:
        row.tokens += run.tokens
        row.steps += len(run.steps)
        row.predicted_s += run.predicted_s
        row.drafted += run.drafted
        row.accepted += run.accepted
        row.misses += run.misses
        row.near_ties += len(run.near_ties)
        row.lengths.append([s.drafted for s in run.steps])
        row.oracle.append([s.oracle for s in run.steps])
    return row


def sweep_rules(atlases: Sequence[Atlas], points: Sequence[tuple[str, dict[str, Any]]],
                base: RunConfig | None = None) -> list[RuleRow]:
    """Every point on every atlas, best predicted tokens/s first."""
    alone = (base or RunConfig()).replace(drafter="model")  # TALON over the draft alone, as the chains draft
    rows = [talon_row(atlases, alone) if name == "talon" else chain_row(atlases, name, knobs) for name, knobs in points]
    return sorted(rows, key=lambda r: -r.tokens_per_s)


def rule_table(rows: Sequence[RuleRow]) -> str:
    head = ["rule", "MAT", "tok/s (pred.)", "drafted", "accepted", "coverage", "near-ties"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        lines.append(" | ".join([r.label(), f"{r.mat:.3f}", f"{r.tokens_per_s:.2f}", str(r.drafted),
                                 str(r.accepted), "exact" if not r.misses else f"{r.misses} miss(es)",
                                 str(r.near_ties)]))
    return "\n".join(lines)


# each rule's small grid, searched for its best setting (the explorer's table, the lesson, the run file)
BEST_GRIDS: dict[str, dict[str, tuple[Any, ...]]] = {
    "fixed": {"k": (1, 2, 3, 4, 5, 6, 8)},
    "hf-heuristic": {"num_assistant_tokens": (2, 5, 10, 20), "confidence": (0.0, 0.2, 0.4, 0.6)},
    "hf-heuristic-transient": {"num_assistant_tokens": (2, 5, 10, 20), "confidence": (0.0, 0.2, 0.4, 0.6)},
    "hf-confidence": {"num_assistant_tokens": (2, 5, 10, 20), "confidence": (0.0, 0.2, 0.4, 0.6)},
    "sglang-adaptive": {"candidate_steps": ((1, 3, 7), (1, 2, 4), (2, 4, 8), (1, 3, 5, 7)),
                        "ema_alpha": (0.2, 0.5), "down_hysteresis": (-0.25, 0.0)},
    "vllm-dsd": {"k": (1, 2, 3, 4, 5, 6, 8)},
    "llamacpp-streak": {"n_max": (4, 8, 16), "threshold_n": (2, 5, 11)},
}


def grid_points(name: str) -> list[dict[str, Any]]:
    grid = BEST_GRIDS.get(name, {})
    return [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())]


@dataclass
class RuleBest:
    """One rule at its defaults and at its best setting on the atlases."""

    rule: str
    defaults: RuleRow
    best: RuleRow


def best_per_rule(atlases: Sequence[Atlas], base: RunConfig | None = None,
                  rules: Sequence[str] = RULES) -> list[RuleBest]:
    """Every rule at its defaults and at the best point of its grid (predicted tokens/s), best
    first; ``talon`` is replayed at ``base`` only (the knobs at hand; the draft alone by default)."""
    out = []
    for name in rules:
        if name == "talon":
            row = talon_row(atlases, base or RunConfig(drafter="model"))
            out.append(RuleBest(name, row, row))
            continue
        defaults = chain_row(atlases, name, {})
        tried = [defaults] + [chain_row(atlases, name, knobs) for knobs in grid_points(name)]
        out.append(RuleBest(name, defaults, max(tried, key=lambda r: r.tokens_per_s)))
    return sorted(out, key=lambda b: -b.best.tokens_per_s)


def adaptive_advice(atlases: Sequence[Atlas], talon_rate: float | None = None) -> list[str]:
    """Serve it's lines on adaptive draft length: each engine's adaptive setting where it beats
    that engine's best fixed length on the atlases, and plainly where a fixed length (or TALON's
    gate, at ``talon_rate`` tokens/s) wins instead."""
    bests = {b.rule: b for b in best_per_rule(atlases, rules=RULES[1:])}
    fixed = bests["fixed"].best
    k = fixed.setting.get("k", FixedChain().k)

    def versus(row: RuleRow) -> str:
        return f"{row.tokens_per_s:.2f} against {fixed.tokens_per_s:.2f} tok/s for a fixed {k}"

    lines = []
    sg = bests["sglang-adaptive"].best
    if sg.tokens_per_s > fixed.tokens_per_s:
        config = {key: list(v) if isinstance(v, tuple) else v for key, v in sg.setting.items()}
        lines.append(f"SGLang: `--speculative-adaptive --speculative-adaptive-config adaptive.json` with "
                     f"`{json.dumps(config or {'candidate_steps': [1, 3, 7]})}` ({versus(sg)} draft tokens)")
    else:
        how = "does as well" if sg.tokens_per_s == fixed.tokens_per_s else "wins"
        lines.append(f"SGLang: leave `--speculative-adaptive` off; `--speculative-num-steps {k}` with topk 1 {how} "
                     f"({fixed.tokens_per_s:.2f} against {sg.tokens_per_s:.2f} tok/s at the adaptive rule's best)")
    hf = max((bests[n].best for n in HF_SCHEDULE), key=lambda r: r.tokens_per_s)
    if hf.tokens_per_s > fixed.tokens_per_s:
        schedule = HF_SCHEDULE[hf.rule]
        knobs = ", ".join(f"{HF_ARGS.get(key, key)}={v}" for key, v in hf.setting.items())
        lines.append(f"transformers: `num_assistant_tokens_schedule=\"{schedule}\"`"
                     + (f" with {knobs}" if knobs else "") + f" ({versus(hf)})")
    else:
        lines.append(f"transformers: a constant `num_assistant_tokens={k}` with `assistant_confidence_threshold=0` "
                     f"wins ({fixed.tokens_per_s:.2f} against {hf.tokens_per_s:.2f} tok/s for its adaptive rules)")
    lines.append(f"vLLM: `num_speculative_tokens_per_batch_size` picks K by batch size only, so at one request it "
                 f"is a fixed K: {k} is best here")
    lines.append("llama.cpp: nothing merged adapts the draft length at the pinned version (the open proposal "
                 f"#25726 would give {bests['llamacpp-streak'].best.tokens_per_s:.2f} tok/s here at its best)")
    if talon_rate is not None:
        top = max([fixed, sg, hf], key=lambda r: r.tokens_per_s)
        lines.append(f"TALON's gate at the controls: {talon_rate:.2f} tok/s, "
                     + ("ahead of every engine's rule here" if talon_rate >= top.tokens_per_s
                        else f"behind {top.label()} here"))
    return lines
