"""The written report: ``results.json``, ``results.md`` (speed table, losslessness, time split,
sweep) and the Plotly HTML figures."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from talon.bench.charts import speedup_figure, sweep_figure, time_split_figure
from talon.bench.options import ALL_SUITES_ROW
from talon.bench.results import (
    TIME_PARTS,
    BenchReport,
    ResultRow,
    fmt,
    methods_of,
    suites_of,
)

logger = logging.getLogger("talon.bench")


def write_report(report: BenchReport, out: Path) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report.to_dict(), indent=1), encoding="utf-8")
    (out / "results.md").write_text(markdown(report), encoding="utf-8")
    main_rows = [r for r in report.rows if not r.is_sweep]
    speedup_figure(main_rows).write_html(out / "speedup.html", include_plotlyjs="directory")
    if any(r.draft_s is not None and r.method != "ar" for r in main_rows):
        time_split_figure(main_rows).write_html(out / "time_split.html", include_plotlyjs="directory")
    sweep_rows = [r for r in report.rows if r.is_sweep]
    if sweep_rows:
        sweep_figure(sweep_rows).write_html(out / "sweep.html", include_plotlyjs="directory")
    logger.info("wrote %s", ", ".join(sorted(p.name for p in out.iterdir())))


def markdown(report: BenchReport) -> str:
    env = report.env
    head = (
        f"# Talon benchmark\n\n{env.target} ({env.target_weights}) / draft {env.draft} "
        f"({env.draft_quant}), {env.dtype} on {env.device}" + (f", forward {env.forward} " if env.forward else " ") +
        f"({env.gpu or env.cpu}, {env.cores} cores, {env.torch_threads} torch threads), "
        f"torch {env.torch}, transformers {env.transformers}, {env.date}.\n"
        + (f"\n`{env.command}`\n" if env.command else "")
    )
    main_rows = [r for r in report.rows if not r.is_sweep]
    sweep_rows = [r for r in report.rows if r.is_sweep]
    parts = [head, speed_table(main_rows), variants_note(main_rows), bound_section(main_rows), lossless_section(report)]
    parts += [time_split_section(main_rows), sweep_section(sweep_rows)]
    return "\n".join(p for p in parts if p)


BOUND_METHOD = "talon"  # the method whose free-drafting bound the speed table shows
PEER_METHOD = "hf-greedy"  # transformers' generate(): the speed table states talon against it too


def speed_table(rows: Sequence[ResultRow]) -> str:
    if not rows:
        return ""
    methods = methods_of(rows)
    cell = {(r.suite, r.method): r for r in rows}
    bounded = any(r.method == BOUND_METHOD and r.free_draft_bound is not None for r in rows)
    peer = PEER_METHOD in methods and BOUND_METHOD in methods
    extra = [f"{BOUND_METHOD} bound", "share"] if bounded else []
    extra += [f"{BOUND_METHOD} vs generate()"] if peer else []
    legend = "Each cell: speedup vs ar · MAT (tokens per target forward) · tokens/s."
    if peer:
        legend += (f" `{BOUND_METHOD} vs generate()`: its tokens/s over `{PEER_METHOD}`'s, transformers' own greedy "
                   "`generate()` in the same run (the peer baseline beside `ar`).")
    if bounded:
        legend += (f" `{BOUND_METHOD} bound`: the speedup free drafting would give `{BOUND_METHOD}`'s "
                   "trees on this host, MAT × t_verify(1) / mean t_verify(tree); `share`: the part of it "
                   "reached (see below).")
    lines = [
        f"## Speed\n\n{legend}\n",
        "| suite | prompts | " + " | ".join(methods + extra) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in methods + extra) + " |",
    ]
    for suite in suites_of(rows):
        texts = []
        for m in methods:
            r = cell[(suite, m)]
            texts.append(f"{r.speedup_vs_ar:.2f}x · {fmt(r.mat, '.2f')} · {r.tokens_per_second:.1f}")
        if bounded:
            r = cell[(suite, BOUND_METHOD)]
            texts += [f"{fmt(r.free_draft_bound, '.2f')}x", _percent(r.bound_share)]
        if peer:
            ours, theirs = cell[(suite, BOUND_METHOD)], cell[(suite, PEER_METHOD)]
            ratio = ours.tokens_per_second / theirs.tokens_per_second if theirs.tokens_per_second else None
            texts.append(f"{ratio:.2f}x" if ratio is not None else "–")
        label = f"**{suite}**" if suite == ALL_SUITES_ROW else suite
        lines.append(f"| {label} | {cell[(suite, 'ar')].prompts} | " + " | ".join(texts) + " |")
    return "\n".join(lines) + "\n"


def _percent(share: float | None) -> str:
    return "–" if share is None else f"{100 * share:.0f}%"


def bound_section(rows: Sequence[ResultRow]) -> str:
    """Every drafting Talon method against its free-drafting bound, per suite."""
    methods = [m for m in methods_of(rows) if m != "ar"
               and any(r.method == m and r.free_draft_bound is not None for r in rows)]
    if not methods:
        return ""
    cell = {(r.suite, r.method): r for r in rows}
    intro = (
        "With free drafting and no per-step overhead a step would cost one verification, so a "
        "method's speedup over ar is at most MAT × t_verify(1) / mean over its steps of "
        "t_verify(tree tokens), t_verify being the measured verify curve the runs planned on "
        "(`cost_models`). Each cell: speedup · bound · share of the bound reached. The rest of the "
        "gap is drafting, per-step overhead and setup (prompt prefill: ar pays it too, the bound "
        "leaves it out).\n"
    )
    lines = [
        "## How close to the limit\n",
        intro,
        "| suite | " + " | ".join(methods) + " |",
        "| --- | " + " | ".join("---:" for _ in methods) + " |",
    ]
    for suite in suites_of(rows):
        texts = []
        for m in methods:
            r = cell.get((suite, m))
            texts.append("–" if r is None else
                         f"{r.speedup_vs_ar:.2f}x · {fmt(r.free_draft_bound, '.2f')}x · {_percent(r.bound_share)}")
        label = f"**{suite}**" if suite == ALL_SUITES_ROW else suite
        lines.append(f"| {label} | " + " | ".join(texts) + " |")
    return "\n".join(lines) + "\n"


def variants_note(rows: Sequence[ResultRow]) -> str:
    picks = [
        f"{r.method}, {r.suite}: `{r.settings['variant']}` of "
        + ", ".join(f"{k} {v:.2f}x" for k, v in r.settings["variants"].items())
        for r in rows
        if "variants" in r.settings
    ]
    if not picks:
        return ""
    return (
        "Best-of peers report their fastest variant per suite: hf-assisted's `num_assistant_tokens` "
        "(an integer: fixed draft length; `default`: transformers' defaults, adaptive threshold "
        "included) and hf-pld's `max_matching_ngram_size` (`n=2`, transformers' default; `n=3`, the "
        "prompt-lookup recipe's):\n\n"
        + "\n".join(f"- {p}" for p in picks)
        + "\n"
    )


CHECK_COLUMNS = (
    "suite", "prompt", "method", "position", "why", "token", "target's token", "logit gap", "top-2 gap", "tolerance",
)


def lossless_section(report: BenchReport) -> str:
    checks = report.checks
    positions = sum(c.check.positions for c in checks)
    near = sum(len(c.check.near_ties) for c in checks)
    bad = [c for c in checks if not c.check.lossless]
    lines = [
        "## Lossless check\n",
        (
            f"Every token checked: {len(checks)} outputs, {positions} positions, each teacher-forced "
            f"through the target ({report.judged_in}) and compared with its choice given the method's own prefix. "
            f"{near} near-tie position(s) ({100 * near / max(positions, 1):.2f} % of positions) in "
            f"{sum(bool(c.check.near_ties) for c in checks)} output(s); "
            f"{len(bad)} output(s) with a real mismatch ({len(report.fatal)} of Talon methods).\n"
        ),
        "| method | outputs | positions | near-tie positions | outputs differing from ar | real mismatches |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for method in dict.fromkeys(c.method for c in checks):
        mine = [c for c in checks if c.method == method]
        spots, ties = sum(c.check.positions for c in mine), sum(len(c.check.near_ties) for c in mine)
        lines.append(
            f"| {method} | {len(mine)} | {spots} | "
            f"{ties} ({100 * ties / max(spots, 1):.2f} %) | {sum(c.departs_from_ar is not None for c in mine)} | "
            f"{sum(not c.check.lossless for c in mine)} |"
        )
    if bad:
        lines += [
            "",
            "| " + " | ".join(CHECK_COLUMNS) + " |",
            "| --- | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for c in bad:
            m = c.check.first_mismatch
            assert m is not None
            lines.append(
                f"| {c.suite} | {c.prompt_index} | {c.method} | {m.position} | {m.reason} | {fmt(m.token, 'd')} | "
                f"{fmt(m.best_token, 'd')} | {fmt(m.logit_gap, '.4f')} | {fmt(m.top2_gap, '.4f')} "
                f"| {fmt(m.tolerance, '.4f')} |"
            )
    return "\n".join(lines) + "\n"


def time_split_section(rows: Sequence[ResultRow]) -> str:
    split_rows = [r for r in rows if r.suite == ALL_SUITES_ROW and r.draft_s is not None and r.method != "ar"]
    if not split_rows:
        return ""
    lines = [
        "## Where the time goes (all suites, Talon methods)\n",
        "| method | wall s | " + " | ".join(k.removesuffix("_s") for k in TIME_PARTS) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in TIME_PARTS) + " |",
    ]
    for r in split_rows:
        shares = [f"{getattr(r, k):.1f} s ({100 * getattr(r, k) / r.seconds:.0f}%)" for k in TIME_PARTS]
        lines.append(f"| {r.method} | {r.seconds:.1f} | " + " | ".join(shares) + " |")
    ar = next((r for r in rows if r.suite == ALL_SUITES_ROW and r.method == "ar"), None)
    return "\n".join(lines) + "\n\n" + closing_note(split_rows, ar) + "\n"


def closing_note(split_rows: Sequence[ResultRow], ar: ResultRow | None) -> str:
    """Name the biggest remaining cost of the full method (``talon`` if it ran) and, when that
    is setup (mostly the prompt prefill, which ar pays too), the biggest per-step cost."""
    row = next((r for r in split_rows if r.method == "talon"), split_rows[-1])
    part = max(TIME_PARTS, key=lambda k: getattr(row, k))
    note = (
        f"**Biggest remaining cost** ({row.method}, all suites): {TIME_PARTS[part]}, "
        f"{100 * getattr(row, part) / row.seconds:.0f}% of the wall time."
    )
    if part == "setup_s":
        step = max((k for k in TIME_PARTS if k != "setup_s"), key=lambda k: getattr(row, k))
        paid = f" (ar's setup: {ar.setup_s:.1f} s)" if ar is not None and ar.setup_s is not None else ""
        note += (
            f" Setup is mostly the target's prompt prefill, paid by every method alike{paid}; per step, "
            f"the biggest cost is {TIME_PARTS[step]}, {100 * getattr(row, step) / row.seconds:.0f}%."
        )
    return note


def sweep_section(rows: Sequence[ResultRow]) -> str:
    all_rows = [r for r in rows if r.suite == ALL_SUITES_ROW]
    if not all_rows:
        return ""
    mus = sorted({r.mu for r in all_rows})
    budgets = sorted({r.budget for r in all_rows})
    cell = {(r.root_k, r.mu, r.budget): r for r in all_rows}
    lines = [f"## Sweep: {all_rows[0].method}, all suites\n\nEach cell: speedup vs ar · MAT.\n"]
    for k in sorted({r.root_k for r in all_rows}):
        lines += [
            f"K = {k}\n",
            "| mu \\ N | " + " | ".join(str(n) for n in budgets) + " |",
            "| ---: | " + " | ".join("---:" for _ in budgets) + " |",
        ]
        for mu in mus:
            here = [cell[(k, mu, n)] for n in budgets]
            texts = [f"{r.speedup_vs_ar:.2f}x · {fmt(r.mat, '.2f')}" for r in here]
            lines.append(f"| {mu:g} | " + " | ".join(texts) + " |")
        lines.append("")
    return "\n".join(lines)
