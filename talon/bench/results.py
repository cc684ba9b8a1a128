"""Aggregation: per (suite, method) rows of speed, MAT and time split, and the report they make.

How close to the limit: with free drafting and no overhead, a step costs one verification, so a
Talon method's speedup over ``ar`` on this host is at most its *free-drafting bound*

    bound = MAT x t_verify(1) / mean over steps of t_verify(tree tokens of the step)

from the measured verify curve the Talon runs planned on (``ar`` verifies the root alone, 1
token per step). With every step the same size this is MAT x t_verify(1) / t_verify(mean tree
size); averaging t_verify over the steps instead of taking it at the mean size keeps it a bound
when sizes vary (t_verify is concave on a CPU, so t_verify(mean) overstates the mean cost). The
share reached, speedup / bound, says how much of the gap is drafting and per-step overhead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from talon.bench.env import BenchEnv
from talon.bench.judge import OutputCheck
from talon.bench.options import ALL_SUITES_ROW, BENCH_FORMAT, BenchConfig
from talon.bench.runners import MethodSpec, Outcome, Runner
from talon.specbench import Prompt
from talon.trace import serving_metrics


@dataclass(frozen=True)
class Sample:
    prompt: Prompt
    spec: MethodSpec
    outcome: Outcome


@dataclass(frozen=True)
class TimeSplit:
    """Where a Talon method's wall time went; the four parts sum to the wall time."""

    draft_s: float | None = None
    verify_s: float | None = None
    other_s: float | None = None
    setup_s: float | None = None

    @staticmethod
    def of(outcomes: Sequence[Outcome], seconds: float) -> TimeSplit:
        if not outcomes or any(o.draft_s is None for o in outcomes):
            return TimeSplit()
        draft = sum(o.draft_s or 0.0 for o in outcomes)
        verify = sum(o.verify_s or 0.0 for o in outcomes)
        other = sum(o.other_s or 0.0 for o in outcomes)
        return TimeSplit(draft, verify, other, seconds - draft - verify - other)


@dataclass
class ResultRow:
    """One (suite, method) cell. ``mu``/``budget``/``root_k`` are set on sweep rows only."""

    suite: str
    method: str
    prompts: int
    new_tokens: int
    seconds: float
    mat: float | None
    tokens_per_second: float
    speedup_vs_ar: float
    lossless: bool  # every token of every output was the target's choice (argmax or near-tie)
    near_ties: int  # positions decided by a near-tie, over all outputs
    mismatches: int  # outputs with a real mismatch
    draft_s: float | None
    verify_s: float | None
    other_s: float | None
    setup_s: float | None
    settings: dict[str, Any]
    serving_metrics: dict[str, Any] | None = None  # Talon methods: talon.trace.serving_metrics
    free_draft_bound: float | None = None  # Talon methods: the speedup free drafting would reach (module doc)
    bound_share: float | None = None  # speedup_vs_ar / free_draft_bound
    mu: float | None = None
    budget: int | None = None
    root_k: int | None = None

    @property
    def is_sweep(self) -> bool:
        return self.mu is not None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if not self.is_sweep:
            for key in ("mu", "budget", "root_k"):
                del data[key]
        return data


def aggregate(
    samples: Sequence[Sample], checks: Sequence[OutputCheck], runners: Sequence[Runner],
    verify_s: Callable[[int], float] | None = None,
) -> list[ResultRow]:
    """Rows per suite (in prompt order) and over all suites; best-of variants collapsed.
    ``verify_s``: the measured verify curve (seconds for T tree tokens), for the bound."""
    suites = list(dict.fromkeys(s.prompt.suite for s in samples)) + [ALL_SUITES_ROW]
    rows: list[ResultRow] = []
    for suite in suites:
        chosen = [s for s in samples if suite == ALL_SUITES_ROW or s.prompt.suite == suite]
        mine = [c for c in checks if suite == ALL_SUITES_ROW or c.suite == suite]
        ar = [s.outcome for s in chosen if s.spec.name == "ar"]
        ar_rate = tokens_per_second(ar)
        cells = []
        for spec in (r.spec for r in runners):
            outcomes = [s.outcome for s in chosen if s.spec.name == spec.name]
            cells.append((spec, result_row(suite, spec, outcomes, mine, ar_rate, verify_s)))
        rows += collapse_variants(cells)
    return rows


def tokens_per_second(outcomes: Sequence[Outcome]) -> float:
    seconds = sum(o.seconds for o in outcomes)
    return sum(len(o.token_ids) for o in outcomes) / seconds if seconds > 0 else 0.0


def free_draft_bound(outcomes: Sequence[Outcome], verify_s: Callable[[int], float] | None) -> float | None:
    """MAT x t_verify(1) / mean t_verify(tree tokens) over every step of ``outcomes`` (root
    included in a step's tree tokens); None without a verify curve or per-step tree sizes."""
    if verify_s is None or not outcomes or any(o.draft_sizes is None for o in outcomes):
        return None
    sizes = [n for o in outcomes for n in o.draft_sizes or []]
    if not sizes:
        return None
    tokens = sum(len(o.token_ids) for o in outcomes)
    return tokens * verify_s(1) / sum(verify_s(n + 1) for n in sizes)


def result_row(
    suite: str, spec: MethodSpec, outcomes: Sequence[Outcome], checks: Sequence[OutputCheck], ar_rate: float,
    verify_s: Callable[[int], float] | None = None,
) -> ResultRow:
    """Speedup is the ratio of tokens per second (prefill included) to ar's over the same prompts:
    where a bf16 near-tie sends a method down another, longer or shorter, continuation, a ratio
    of wall times would count the length difference as speed."""
    seconds = sum(o.seconds for o in outcomes)
    tokens = sum(len(o.token_ids) for o in outcomes)
    rate = tokens_per_second(outcomes)
    forwards = [o.forwards or 0 for o in outcomes]
    mine = [c.check for c in checks if c.method == spec.name]
    mismatches = sum(not c.lossless for c in mine)
    split = TimeSplit.of(outcomes, seconds)
    cell = spec.cell
    speedup = rate / ar_rate if ar_rate > 0 else 0.0
    bound = free_draft_bound(outcomes, verify_s)
    return ResultRow(
        suite=suite,
        method=spec.method,
        prompts=len(outcomes),
        new_tokens=tokens,
        seconds=seconds,
        mat=tokens / sum(forwards) if forwards and all(forwards) else None,  # None: forwards not counted
        tokens_per_second=rate,
        speedup_vs_ar=speedup,
        lossless=mismatches == 0,
        near_ties=sum(len(c.near_ties) for c in mine),
        mismatches=mismatches,
        draft_s=split.draft_s,
        verify_s=split.verify_s,
        other_s=split.other_s,
        setup_s=split.setup_s,
        settings=dict(spec.settings),
        serving_metrics=_serving_metrics(outcomes),
        free_draft_bound=bound,
        bound_share=speedup / bound if bound else None,
        mu=cell.mu if cell else None,
        budget=cell.budget if cell else None,
        root_k=cell.root_k if cell else None,
    )


def _serving_metrics(outcomes: Sequence[Outcome]) -> dict[str, Any] | None:
    if not outcomes or any(o.accept_lens is None or o.draft_sizes is None for o in outcomes):
        return None
    return serving_metrics([a for o in outcomes for a in o.accept_lens or []],
                           [n for o in outcomes for n in o.draft_sizes or []])


def collapse_variants(cells: Sequence[tuple[MethodSpec, ResultRow]]) -> list[ResultRow]:
    """Keep the fastest variant of each best-of method, naming it and listing every variant's speedup."""
    groups: dict[str, list[ResultRow]] = {}
    for spec, row in cells:
        groups.setdefault(row.method if spec.best_of else spec.name, []).append(row)
    rows = []
    for group in groups.values():
        best = max(group, key=lambda r: r.tokens_per_second)
        if "variant" in best.settings:
            best.settings["variants"] = {r.settings["variant"]: round(r.speedup_vs_ar, 4) for r in group}
        rows.append(best)
    return rows


@dataclass
class BenchReport:
    env: BenchEnv
    config: BenchConfig
    rows: list[ResultRow]
    checks: list[OutputCheck]
    samples: list[Sample] = dataclasses.field(default_factory=list)
    cost_models: dict[str, Any] = dataclasses.field(default_factory=dict)  # the snapshots the Talon runs planned on
    judged_in: str = "float32"  # the judge's precision (talon.bench.judge.TieJudge.precision)

    @property
    def fatal(self) -> list[OutputCheck]:
        """Outputs of Talon-engine methods with a real mismatch: the run must fail."""
        return [c for c in self.checks if c.engine == "talon" and not c.check.lossless]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": BENCH_FORMAT,
            "env": dataclasses.asdict(self.env),
            "config": dataclasses.asdict(self.config),
            "results": [r.to_dict() for r in self.rows],
            "cost_models": self.cost_models,
            "judged_in": self.judged_in,
            "checks": [c.to_dict() for c in self.checks],
            "samples": [sample_record(s) for s in self.samples],
        }


def sample_record(sample: Sample) -> dict[str, Any]:
    """One run of one method on one prompt, with its per-step tree sizes and accepted lengths
    (Talon methods): two runs of the same command can be compared tree by tree."""
    o = sample.outcome
    return {
        "suite": sample.prompt.suite, "prompt_index": sample.prompt.index, "method": sample.spec.name,
        "new_tokens": len(o.token_ids), "seconds": round(o.seconds, 4), "forwards": o.forwards,
        "draft_sizes": o.draft_sizes, "accept_lens": o.accept_lens,
    }


TIME_PARTS: dict[str, str] = {
    "draft_s": "drafting (draft-model forwards that grow the tree, retrieval)",
    "verify_s": "verification (the target's one forward over the tree)",
    "other_s": "per-step bookkeeping (acceptance, KV commit, drafter update, traces)",
    "setup_s": "setup (prompt prefill, drafter reset, per-run setup)",
}


def methods_of(rows: Sequence[ResultRow]) -> list[str]:
    return list(dict.fromkeys(r.method for r in rows))


def suites_of(rows: Sequence[ResultRow]) -> list[str]:
    return list(dict.fromkeys(r.suite for r in rows))


def fmt(value: float | None, pattern: str) -> str:
    return "–" if value is None else format(value, pattern)
