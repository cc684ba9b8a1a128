"""What plain decoding would have done on the same host: the baseline every speed in the app is
shown beside, measured where a plain run of the prompt ran, else from the run's cost curve."""

from __future__ import annotations

from dataclasses import dataclass

from talon.trace import RunSummary, StepTrace


@dataclass(frozen=True)
class PlainRate:
    """Seconds per token of plain decoding (one target forward per token) and where it came from."""

    step_s: float
    measured: bool  # a plain run of this prompt ran (else: estimated from the cost curve)

    @property
    def tokens_per_s(self) -> float:
        return 1.0 / self.step_s

    @property
    def source(self) -> str:
        return "measured" if self.measured else "from the cost curve"

    def describe(self) -> str:
        return ("measured: plain decoding of this prompt ran beside it" if self.measured else
                "estimated from this host's cost curve: one target forward of 1 token plus the step's overhead")


def plain_rate(summary: RunSummary | None, ar: RunSummary | None = None) -> PlainRate | None:
    """Plain decoding's rate for this run: the measured baseline ``ar`` where one ran, else the
    cost curve's one-token forward plus the per-step overhead; None where neither is known."""
    if ar is not None and ar.tokens_per_second > 0:
        return PlainRate(1.0 / ar.tokens_per_second, True)
    curves = summary.cost_model if summary is not None else {}
    one = verify_at(curves, 1)
    if one is None:
        return None
    return PlainRate(one + float(curves.get("other_s") or 0.0), False)


def verify_at(curves: dict, nodes: int) -> float | None:
    """The cost curve's seconds to verify ``nodes`` nodes (its nearest grid size at or above), or None."""
    grid, verify = curves.get("grid") or [], curves.get("verify_s") or []
    sizes = [(g, v) for g, v in zip(grid, verify) if g >= nodes]
    return sizes[0][1] if sizes else (verify[-1] if verify else None)


def step_verdict(st: StepTrace, plain: PlainRate | None) -> tuple[bool, float] | None:
    """(whether the step beat plain decoding of its tokens, plain decoding's seconds for them)."""
    if plain is None:
        return None
    spent = st.draft_s + st.verify_s + st.other_s
    alone = plain.step_s * len(st.new_tokens)
    return spent <= alone, alone


def parting_words(summary: RunSummary | None, ar: RunSummary | None) -> str | None:
    """Where plain decoding's text parts from the run's, in words (None: they agree, or one is
    shorter only because it stopped): greedy runs agree token for token in float32; in bf16 or
    float16 a rounding tie can part them, since the two runs' forwards have different shapes."""
    if summary is None or ar is None:
        return None
    run, plain = summary.token_ids, ar.token_ids
    at = next((i for i, (a, b) in enumerate(zip(run, plain)) if a != b), None)
    if at is None:
        return None
    sampled = (summary.config.get("sampling") or {}).get("temperature", 0) not in (0, 0.0, None)
    why = ("under sampling each run draws its own tokens from the target's distribution" if sampled else
           f"in {summary.dtype or 'this dtype'} a rounding tie between the two best tokens can go either way, since "
           "the two runs' forwards have different shapes; in float32 greedy runs agree token for token")
    return f"Plain decoding's text parts from this run's at token {at}: {why}."
