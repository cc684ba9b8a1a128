"""HTML: the streamed text with each token's provenance, the plain-language step caption, and
the run summary. All user and model text goes through ``esc``."""

from __future__ import annotations

from collections.abc import Sequence

from talon.figures.common import SOURCE_NAMES, Committed, committed_tokens
from talon.figures.payoff import plain_rate
from talon.figures.run import step_end_times
from talon.figures.text import esc, fmt_number
from talon.knobs import DRAFTERS
from talon.trace import RunSummary, StepTrace
from talon.tree import layer_width

# ---------------------------------------------------------------------------------------------
# HTML: streamed text with provenance, step caption, run summary
# ---------------------------------------------------------------------------------------------


def _token_title(st: StepTrace, tok: Committed) -> str:
    if tok.node is None:
        return f"step {st.step} · {KIND_WORDS[tok.source]}"
    parts = [
        f"step {st.step}",
        f"{SOURCE_NAMES.get(tok.source, tok.source)} draft, depth {st.depths[tok.node]}",
        f"q {fmt_number(st.q_draft[tok.node])}",
        f"c {fmt_number(st.path_conf[tok.node])}",
    ]
    if tok.node < len(st.p_target) and st.p_target[tok.node] is not None:
        parts.append(f"p_target {fmt_number(st.p_target[tok.node])}")
    return " · ".join(parts)


KIND_WORDS: dict[str, str] = {
    "bonus": "target bonus token: every draft on the path was accepted, so this one is a free draw "
    "from the target after the last of them",
    "resampled": "resampled: the target rejected the draft here and put its own token in its place "
    "(under sampling drawn from what the rejected drafts left of its distribution)",
}


def _step_html(st: StepTrace, selected: bool, titles: bool = True) -> str:
    spans = [
        f'<span class="tk src-{esc(tok.source)}"'
        + (f' title="{esc(_token_title(st, tok))}"' if titles else "")
        + f">{esc(tok.text)}</span>"
        for tok in committed_tokens(st)
    ]
    cls = "step sel" if selected else "step"
    parity = "odd" if st.step % 2 else "even"
    return f'<span class="{cls} {parity}" data-step="{st.step}">{"".join(spans)}</span>'


def text_html(
    steps: Sequence[StepTrace],
    upto: int | None = None,
    highlight: int | None = None,
    status: str = "",
    titles: bool = True,
) -> str:
    """The generated text, one span per token coloured by provenance, steps delimited.

    upto: show steps[0..upto] only (step-through); highlight: index of the step to emphasise;
    titles: per-token hover titles (two thirds of the bytes; left out while a run streams, since
    the whole text is resent with every update)."""
    shown = steps if upto is None else steps[: upto + 1]
    body = "".join(_step_html(st, i == highlight, titles) for i, st in enumerate(shown))
    note = f'<div class="talon-status">{esc(status)}</div>' if status else ""
    placeholder = '<span class="talon-placeholder">The generated text appears here, token by token.</span>'
    return f'<div class="talon-text">{body or placeholder}</div>{note}'


def step_caption_html(steps: Sequence[StepTrace], index: int) -> str:
    """Plain-language account of one step: what was drafted, what the target accepted."""
    if not steps:
        return '<div class="talon-caption">No step to show yet.</div>'
    st = steps[index]
    tokens = committed_tokens(st)
    committed = "".join(f'<span class="tk src-{esc(t.source)}">{esc(t.text)}</span>' for t in tokens)
    retrieval = f", retrieval match {st.match_len} tokens" if st.match_len else ""
    return (
        f'<div class="talon-caption"><b>Step {st.step}</b> ({index + 1} of {len(steps)}): drafted '
        f"{len(st.tokens) - 1} nodes (depth {max(st.depths)}, widest layer {layer_width(st.depths)}{retrieval}); "
        f"the target accepted {st.accept_len} and {_last_token_words(st)} → {len(tokens)} committed: "
        f'<span class="talon-committed">{committed}</span> · draft {st.draft_s * 1e3:.0f} ms '
        f"({st.draft_forwards} draft forward{'s' if st.draft_forwards != 1 else ''}), "
        f"verify {st.verify_s * 1e3:.0f} ms{_planning_note(st)}</div>"
    )


def _last_token_words(st: StepTrace) -> str:
    if st.bonus_kind == "resampled":
        return "rejected the next draft, putting its own token in its place (resampled)"
    return "added its bonus token"


STOP_WORDS: dict[str, str] = {
    "budget": "the budget N was full",
    "depth": "it reached max depth",
    "min_conf": "the best path confidence fell below min_conf",
    "cost": "the next layer would not pay for its draft forward and verification (cost-aware)",
    "empty": "the drafter proposed nothing new",
    "skipped": "the draft model did not run",
    "retrieval": "retrieval-only drafting",
    "none": "no drafter (autoregressive)",
}


def _planning_note(st: StepTrace) -> str:
    """Why the tree stopped, why the draft model was skipped, what the planner expected."""
    parts = []
    if st.tree_stop:
        parts.append(f"tree stopped: {STOP_WORDS.get(st.tree_stop, st.tree_stop)}")
    if st.model_skipped:
        parts.append(st.model_skipped)
    if st.trimmed:
        parts.append(f"{st.trimmed} unprofitable node{'s' if st.trimmed != 1 else ''} trimmed")
    if st.p_accept_est:
        parts.append(f"expected {sum(st.p_accept_est[1:]):.1f} accepted, got {st.accept_len}")
    if st.predicted_verify_s is not None:
        parts.append(f"cost model predicted verify {st.predicted_verify_s * 1e3:.0f} ms")
    return "".join(f'<br><span class="talon-plan">{esc(p)}</span>' for p in parts)


def summary_html(
    summary: RunSummary | None, steps: Sequence[StepTrace], ar: RunSummary | None = None, status: str = ""
) -> str:
    """Run summary: MAT, tokens/s, time split, and the speedup over autoregressive if measured."""
    if summary is None and not steps:
        return f'<div class="talon-summary">{esc(status) or "Press Run to start."}</div>'
    tokens = sum(len(st.new_tokens) for st in steps)
    mat = tokens / len(steps) if steps else 0.0
    seconds = summary.seconds if summary else (step_end_times(steps)[-1] if steps else 0.0)
    tps = tokens / seconds if seconds > 0 else 0.0
    cells = [
        ("MAT", f"{mat:.2f}"),
        ("tokens/s", f"{tps:.1f}"),
        ("tokens", str(tokens)),
        ("steps", str(len(steps))),
        ("seconds", f"{seconds:.2f}"),
    ]
    plain = plain_rate(summary, ar)
    if plain is not None and tps > 0:
        approx = "" if plain.measured else "≈ "
        cells.append((f"plain decoding tokens/s ({plain.source})", f"{approx}{plain.tokens_per_s:.1f}"))
        cells.append(("vs plain decoding", f"{approx}{tps / plain.tokens_per_s:.2f}×"))
    stats = "".join(
        f'<div class="stat"><div class="v">{esc(v)}</div><div class="k">{esc(k)}</div></div>' for k, v in cells
    )
    detail = _summary_detail(summary, steps) if summary else ""
    note = f'<div class="talon-status">{esc(status)}</div>' if status else ""
    return f'<div class="talon-summary"><div class="stats">{stats}</div>{detail}{note}</div>'


def model_skipped_most(summary: RunSummary | None, steps: Sequence[StepTrace]) -> bool:
    """Cost-aware planning skipped the draft model on most steps of a run that uses it: its
    trees were mostly retrieval chains or nothing (the run can be repeated with planning off)."""
    if summary is None or len(steps) < 2:
        return False
    cost_aware = (summary.config.get("tree") or {}).get("cost_aware", False)
    kind = DRAFTERS.get(summary.config.get("drafter", ""))
    uses_model = kind is not None and bool(kind.model)
    return bool(cost_aware and uses_model and 2 * sum(bool(st.model_skipped) for st in steps) > len(steps))


SKIPPED_MOST_NOTE = (
    "The planner skipped the draft model on {skipped} of {steps} steps: on this hardware its trees did not pay, "
    "so most steps verified retrieval guesses or one token. Press “Show the full TALON tree” to run again with "
    "cost-aware planning off (slower here, every step drafts a tree)."
)

PROMPT_SHOWN = 200  # characters of the prompt the summary repeats


def _summary_detail(summary: RunSummary, steps: Sequence[StepTrace]) -> str:
    draft_s = sum(st.draft_s for st in steps)
    verify_s = sum(st.verify_s for st in steps)
    other_s = sum(st.other_s for st in steps)
    total = max(draft_s + verify_s + other_s, 1e-9)
    prompt = summary.prompt if len(summary.prompt) <= PROMPT_SHOWN else summary.prompt[:PROMPT_SHOWN] + "…"
    shown = [f'prompt: <span class="talon-prompt">{esc(prompt)}</span>' if prompt else ""]
    parts = [
        f"target {esc(_short(summary.target))} · draft {esc(_short(summary.draft))}"
        f" · {esc(summary.dtype)} on {esc(summary.device)}",
        f"time: draft {draft_s / total:.0%} · verify {verify_s / total:.0%} · other {other_s / total:.0%}",
        f"stopped: {esc(summary.stop_reason or '–')}",
    ]
    if model_skipped_most(summary, steps):
        skipped = sum(bool(st.model_skipped) for st in steps)
        note = SKIPPED_MOST_NOTE.format(skipped=skipped, steps=len(steps))
        shown.append(f'<span class="talon-skipped">{esc(note)}</span>')
    if summary.tree_stops:
        stops = ", ".join(f"{k} {v}" for k, v in sorted(summary.tree_stops.items(), key=lambda kv: -kv[1]))
        parts.append(f"trees stopped by: {esc(stops)} · draft forwards {summary.draft_forwards}"
                     f" · steps without the draft model {summary.model_skips}")
    curves = summary.cost_model
    if curves.get("verify_s") and curves.get("grid"):
        grid, verify = curves["grid"], curves["verify_s"]
        at = {g: v for g, v in zip(grid, verify)}
        draft = dict(zip(grid, curves.get("draft_s") or []))
        origin = curves.get("described") or curves.get("source", "")
        mode = f"{curves['mode']} · " if curves.get("mode") else ""
        parts.append(
            f"cost model ({esc(mode)}{esc(str(origin))}): verify 1 node {at.get(1, 0) * 1e3:.0f} ms, "
            f"16 nodes {at.get(16, 0) * 1e3:.0f} ms · draft layer {draft.get(1, 0) * 1e3:.0f} ms"
        )
    # the prompt (and the planner's warning) stay in view; models, time split and cost model fold,
    # so that on a 1080p screen the draft tree starts higher
    folded = (f'<details class="talon-run-details"><summary>models, time split, tree stops, cost model'
              f'</summary>{"<br>".join(p for p in parts if p)}</details>')
    return '<div class="detail">' + "<br>".join(p for p in shown if p) + folded + "</div>"


def _short(name: str) -> str:
    """The last two path components of a model name (local paths are long)."""
    return "/".join(name.rstrip("/").split("/")[-2:]) if name else "–"
