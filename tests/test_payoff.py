"""The payoff beside every speed: plain decoding's rate (measured, or from the cost curve, and
labelled which), its lane on the timeline's clock, the walk's verdict on a step, and the
acceptance rule drawn for a node, greedy and sampled."""

from __future__ import annotations

import dataclasses

from talon import figures as F
from talon.trace import RunSummary, StepTrace
from tests.steps import make_step, run_steps, sampled_step

GRID = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]

STOP = {stop.key: i for i, stop in enumerate(F.WALK)}


def summary(verify_one: float = 0.1, other: float = 0.01, tps: float = 12.0) -> RunSummary:
    curves = {"grid": GRID, "verify_s": [verify_one * (1 + (g - 1) / 64) for g in GRID], "other_s": other}
    return RunSummary(text="x", token_ids=[1] * 12, prompt_token_ids=[1], steps=4, mean_accepted_tokens=3.0,
                      tokens_per_second=tps, seconds=1.0, cost_model=curves)


def test_plain_rate_is_measured_where_a_baseline_ran_else_from_the_cost_curve() -> None:
    estimated = F.plain_rate(summary())
    assert estimated is not None and not estimated.measured and abs(estimated.step_s - 0.11) < 1e-12
    measured = F.plain_rate(summary(), ar=dataclasses.replace(summary(), tokens_per_second=4.0))
    assert measured is not None and measured.measured and measured.tokens_per_s == 4.0
    assert F.plain_rate(RunSummary(text="", token_ids=[], prompt_token_ids=[], steps=0, mean_accepted_tokens=0,
                                   tokens_per_second=0, seconds=0)) is None


def test_the_summary_shows_the_speed_beside_plain_decoding_and_says_where_it_came_from() -> None:
    steps = run_steps(4)
    html = F.summary_html(summary(), steps)
    assert "plain decoding tokens/s (from the cost curve)" in html and "vs plain decoding" in html and "≈" in html
    measured = F.summary_html(summary(), steps, ar=dataclasses.replace(summary(), tokens_per_second=4.0))
    assert "plain decoding tokens/s (measured)" in measured and "≈" not in measured


def test_the_timeline_draws_plain_decoding_of_the_same_tokens_on_the_same_clock() -> None:
    steps = run_steps(5)  # 3 tokens a step
    fig = F.timeline_figure(steps, 4, window=2, plain=F.PlainRate(0.004, False))
    plain = next(t for t in fig.data if t.name == "plain decoding")
    assert len(plain.x) == 6 and abs(plain.base[0] - 9 * 4.0) < 1e-9  # tokens 9..14, one 4 ms forward each
    assert "15 tokens" in fig.layout.annotations[0].text and "60 ms" in fig.layout.annotations[0].text
    assert all(t.name != "plain decoding" for t in F.timeline_figure(steps, 4).data)


def test_the_walk_says_whether_a_step_won_or_lost_against_plain_decoding() -> None:
    steps = [dataclasses.replace(s, draft_s=0.01, verify_s=0.12, other_s=0.01) for s in run_steps(3)]
    won = F.walk_html(STOP['cost'], summary(), steps, 1)  # 0.14 s for 3 tokens; plain 0.33 s
    assert "<b>won</b>" in won and "reads every weight once" in won
    slow = [dataclasses.replace(s, draft_s=0.5) for s in steps]
    lost = F.walk_html(STOP['cost'], summary(), slow, 1)
    assert "<b>lost</b>" in lost and "Steps that win pay for the ones that lose" in lost
    assert "plain decoding's" in F.walk_html(STOP['run'], summary(), steps, 1)


def test_the_walk_no_longer_says_sampled_text_equals_the_targets() -> None:
    text = F.walk_html(STOP['verify'], summary(), run_steps(3), 1)
    assert "Greedy or sampled, the text is exactly" not in text and "distribution" in text


def test_the_acceptance_figure_draws_p_q_and_what_was_kept() -> None:
    st = make_step()
    greedy = F.acceptance_figure(st, 1, False)
    names = [t.name for t in greedy.data]
    assert names == ["target p", "draft q"] and "kept" in greedy.layout.title.text
    sampled = F.acceptance_figure(sampled_step(st), 4, True)
    chance = next(t for t in sampled.data if t.name.startswith("chance kept"))
    assert "sampled" in sampled.layout.title.text and any(v is not None for v in chance.y)
    assert "min(1, p(x)/q(x))" in F.RULE_WORDS and "p(x)" in F.RULE_WORDS
    assert "root" in F.acceptance_figure(st, 0, False).layout.annotations[0].text
    # unsaid, the step tells: a sampled step records each tried node's chance, a greedy one none
    assert "sampled" in F.acceptance_figure(sampled_step(st), 4).layout.title.text
    assert "greedy" in F.acceptance_figure(st, 1).layout.title.text


def test_lesson_words_follow_their_data() -> None:
    from talon.figures.lessons import adaptive_words, hybrid_words
    from talon.lessons.adaptive import AdaptiveLesson
    from talon.lessons.hybrid import HybridLesson

    static = {d: 2.0 for d in (1, 2, 3, 4, 5, 6, 7, 8)}
    tie = AdaptiveLesson("qa", "p", 16, static, 2.0, 2.01, funnel_rank={1: 9, 2: 1})
    win = dataclasses.replace(tie, adaptive_mat=2.6)
    assert "a tie" in adaptive_words(tie) and "90 %" in adaptive_words(tie) and "a win" in adaptive_words(win)
    assert "no depth dilemma shows" in adaptive_words(tie, [tie, tie])
    spread = [dataclasses.replace(tie, static_mat={**static, 8: 3.0}),
              dataclasses.replace(tie, static_mat={**static, 2: 3.0})]
    assert "That gap is the static depth dilemma" in adaptive_words(tie, spread)
    mats = {"model": 2.0, "retrieval": 1.2, "hybrid": 2.1}
    model = HybridLesson("qa", "p", mats, {"model": 9.0, "retrieval": 6.0, "hybrid": 8.0})
    hybrid = HybridLesson("qa", "p", mats, {"model": 9.0, "retrieval": 6.0, "hybrid": 9.5})
    assert "the draft model alone is fastest" in hybrid_words(model)
    assert "the hybrid is fastest" in hybrid_words(hybrid)


def test_a_step_without_timings_has_no_verdict() -> None:
    assert F.step_verdict(make_step(), None) is None
    st: StepTrace = dataclasses.replace(make_step(), draft_s=0.0, verify_s=0.001)
    assert F.step_verdict(st, F.PlainRate(0.1, False)) == (True, 0.30000000000000004)


def test_where_plain_decoding_parts_from_the_run_is_said_with_the_reason() -> None:
    run = dataclasses.replace(summary(), token_ids=[5, 6, 7, 8], dtype="bfloat16")
    same = dataclasses.replace(run, token_ids=[5, 6, 7])  # a shorter baseline that agrees: nothing to say
    parted = dataclasses.replace(run, token_ids=[5, 6, 9, 8])
    assert F.parting_words(run, same) is None and F.parting_words(run, None) is None
    words = F.parting_words(run, parted)
    assert words is not None and "at token 2" in words and "in bfloat16 a rounding tie" in words
    sampled = dataclasses.replace(run, config={**run.config, "sampling": {"temperature": 0.8}})
    assert "under sampling" in (F.parting_words(sampled, parted) or "")
