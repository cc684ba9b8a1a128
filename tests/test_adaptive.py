"""The adaptive draft-length rules (``talon.atlas.adaptive``) on small hand-built atlases: each
rule's state moves as its source says, and transformers' ROC threshold is scikit-learn's."""

from __future__ import annotations

import numpy as np
import pytest

from talon.atlas.adaptive import (
    FixedChain,
    LlamaCppStreak,
    SglangAdaptive,
    VllmDynamicK,
    replay_lengths,
    replay_requests,
)
from talon.atlas.adaptive_hf import HfAssisted, roc_threshold
from talon.atlas.data import Atlas
from talon.run_config import ConfigError

LENGTH_EOS = 99


def length_atlas(output: list[int], good: set[int], q: float = 0.9, depth: int = 64) -> Atlas:
    """The draft's chain follows the text from every position in ``good`` (as far as the text
    goes); elsewhere its first token is wrong (token 7, then 7s off the text)."""
    children: dict = {}
    for p in range(len(output) + 1):
        nxt = output[p] if p < len(output) else 5
        children[(p, ())] = [(nxt, q), (8, 0.05)] if p in good else [(7, q), (nxt, 0.05)]
        path: tuple[int, ...] = ()
        for _ in range(depth):
            path += (7,)
            children[(p, path)] = [(7, q), (8, 0.05)]
    return Atlas(prompt_ids=[1, 2, 3], output=output, children=children, eos=[LENGTH_EOS])


def test_roc_threshold_is_scikit_learns() -> None:
    from sklearn.metrics import roc_curve

    rng = np.random.default_rng(0)
    for trial in range(300):
        n = int(rng.integers(6, 60))
        probs = np.round(rng.random(n), int(rng.integers(1, 4))).tolist()  # ties, as float32 q near 1 have
        matches = rng.integers(0, 2, n).tolist()
        if not {0, 1} <= set(matches):
            continue
        fpr, tpr, thresholds = roc_curve(matches, probs)
        want = thresholds[int(np.argmin(fpr + 3 * (1 - tpr)))]
        assert roc_threshold(matches, probs) == want, trial


def test_hf_heuristic_grows_by_two_and_shrinks_by_one_and_persists() -> None:
    text = list(range(10, 40))
    rule = HfAssisted("heuristic", num_assistant_tokens=2, confidence=0.0)
    run = replay_lengths(length_atlas(text, good=set(range(31))), rule)
    assert [s.allowed for s in run.steps][:4] == [2, 4, 6, 8]  # every draft accepted: +2
    assert run.steps[0].p == 0  # transformers drafts before the target's first token
    wrong = replay_lengths(length_atlas(text, good=set()), rule)  # starts where the last request left it
    # 2, 4, 6, 8, then 10 cut to the room (5), all accepted: 12 carried into the next request
    assert [s.allowed for s in run.steps] == [2, 4, 6, 8, 10] and run.steps[-1].drafted == 5
    assert [s.allowed for s in wrong.steps][:4] == [12, 11, 10, 9]  # nothing accepted: -1 a step
    transient = HfAssisted("heuristic_transient", num_assistant_tokens=2, confidence=0.0)
    replay_lengths(length_atlas(text, good=set(range(31))), transient)
    assert replay_lengths(length_atlas(text, good=set()), transient).steps[0].allowed == 2


def test_hf_confidence_stops_after_a_low_token_and_moves_the_threshold() -> None:
    text = list(range(10, 40))
    atlas = length_atlas(text, good=set(range(0, 31, 2)), q=0.3)  # every q below 0.4: one token a step
    run = replay_lengths(atlas, HfAssisted("constant", num_assistant_tokens=5, confidence=0.4))
    assert all(s.drafted == 1 for s in run.steps[:6])
    rule = HfAssisted("constant", num_assistant_tokens=5, confidence=0.4)
    rule.start()
    rule.learn(3, 1, [0.9, 0.2, 0.8])  # one accepted, the first rejected kept, the third dropped
    assert rule.probs == [0.9, 0.2] and rule.matches == [1, 0] and rule.current == 0.4  # five or fewer: not moved
    rule.learn(4, 4, [0.95, 0.7, 0.6, 0.5])
    rule.learn(2, 0, [0.1, 0.9])
    assert len(rule.probs) == 7 and rule.current == roc_threshold(rule.matches, rule.probs) != 0.4


def test_sglang_adaptive_switches_after_warmup_on_the_interval() -> None:
    text = list(range(10, 110))
    rule = SglangAdaptive()
    run = replay_lengths(length_atlas(text, good=set(range(101))), rule)
    allowed = [s.allowed for s in run.steps]
    assert allowed[:15] == [3] * 15 and allowed[15] == 7  # the 15th step's update moves up (ema > 2.5)
    assert rule.ema > 2.5 and rule.steps == 7
    down = replay_lengths(length_atlas(text, good=set()), rule)  # one controller: carried, then down
    assert down.steps[0].allowed == 7 and down.steps[-1].allowed == 1
    with pytest.raises(ConfigError):
        SglangAdaptive(candidate_steps=(3,))


def test_vllm_dynamic_k_is_a_table_by_batch_size() -> None:
    assert VllmDynamicK(k=3, table=((1, 16, 5), (32, 128, 2), (256, 4096, 0)), batch_size=1).length() == 3
    assert VllmDynamicK(k=3, table=((1, 16, 5), (32, 128, 2), (256, 4096, 0)), batch_size=20).length() == 3
    assert VllmDynamicK(k=3, table=((1, 16, 5), (32, 128, 2), (256, 4096, 0)), batch_size=200).length() == 2
    assert VllmDynamicK(k=3, table=((1, 16, 5), (32, 128, 2), (256, 4096, 0)), batch_size=300).length() == 0
    with pytest.raises(ConfigError):
        VllmDynamicK(table=((2, 16, 3),))


def test_llamacpp_streak_moves_one_after_n_in_a_row() -> None:
    text = list(range(10, 60))
    rule = LlamaCppStreak(n_max=6, n_min=1, threshold_n=2)
    run = replay_lengths(length_atlas(text, good=set()), rule)
    assert [s.allowed for s in run.steps][:6] == [6, 6, 5, 5, 4, 4]


def test_fixed_chain_and_the_oracle_and_eos() -> None:
    text = list(range(10, 30)) + [LENGTH_EOS]
    run = replay_lengths(length_atlas(text, good=set(range(22))), FixedChain(4))
    assert [s.new_tokens for s in run.steps] == [5, 5, 5, 5] and run.tokens == len(text)  # the LENGTH_EOS ends it
    assert run.steps[0].oracle == len(text) - 1 and run.mat == len(text) / 4  # the prefill's token counted
    runs = replay_requests([length_atlas(text, good=set())] * 2, FixedChain(2))
    assert all(s.accepted == 0 and s.oracle == 0 for r in runs for s in r.steps)


def test_the_length_lesson_is_replays_and_its_words_follow_them() -> None:
    from talon import figures as F
    from talon.lessons import bundled_atlases
    from talon.lessons.lengths import length_lesson

    atlas = next(a for a in bundled_atlases() if a.suite == "humaneval")
    lesson = length_lesson(atlas, 16)
    talon, hf, sglang = lesson.tracks
    run = replay_lengths(atlas, HfAssisted("heuristic"))
    assert hf.drafted == [s.drafted for s in run.steps] and hf.oracle == [s.oracle for s in run.steps]
    assert sglang.p[0] == 1 and hf.p[0] == 0  # engines sample the first token in the prefill; transformers drafts
    assert talon.shortfall == sum(o - a for o, a, d in zip(talon.oracle, talon.accepted, talon.drafted)
                                  if d < o and a < o)
    words = F.length_lesson_words(lesson)
    fastest = max(lesson.tracks, key=lambda t: t.tokens_per_s)
    assert words.startswith(f"On this prompt {fastest.name} is the fastest")
    lag, at = max(lesson.tracks[1:], key=lambda t: t.lag()[0]).lag()
    assert (f"drafted too few for {lag} steps in a row" in words) == (lag > 1 and lag > talon.lag()[0])
    assert F.length_lesson_figure(lesson).data[0].name == "the oracle"


def test_sweep_by_rule_ranks_the_rules_and_refuses_a_bad_one(capsys) -> None:  # noqa: ANN001
    import json

    from talon.cli.main import main
    from talon.lessons import LESSONS_DIR

    atlas = str(LESSONS_DIR / "humaneval-0.json.gz")
    assert main(["atlas", "sweep", atlas, "--grid", "rule=talon,fixed,hf-heuristic,sglang-adaptive,vllm-dsd",
                 "--grid", "k=2,4", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["rule"] for r in rows].count("fixed") == 2 and [r["rule"] for r in rows].count("vllm-dsd") == 2
    assert rows == sorted(rows, key=lambda r: -r["tokens_per_second"])
    assert {r["rule"] for r in rows} == {"talon", "fixed", "hf-heuristic", "sglang-adaptive", "vllm-dsd"}
    assert main(["atlas", "sweep", atlas, "--grid", "rule=fixed,eagle-magic"]) == 2
    assert main(["atlas", "sweep", atlas, "--grid", "rule=fixed", "--grid", "k=0"]) == 2


def test_the_explorers_knobs_are_the_knob_tables() -> None:
    import dataclasses

    from talon.atlas.explorer import Knobs
    from talon.knobs import EXPLORER_KNOBS

    fields = dataclasses.fields(Knobs)
    assert [f.name for f in fields] == [k.name for k in EXPLORER_KNOBS]
    assert [f.default for f in fields] == [k.default for k in EXPLORER_KNOBS]


def test_talon_replays_at_the_atlass_own_draft_vocabulary() -> None:
    """The transformers fixture's atlases are recorded over the full vocabulary (draft_vocab 0)."""
    from pathlib import Path

    from talon.atlas.adaptive_sweep import talon_row
    from talon.atlas.data import load_atlases
    from talon.lessons.lengths import length_lesson
    from talon.run_config import RunConfig

    atlas = load_atlases([Path(__file__).resolve().parents[1] / "data" / "hf_adaptive" / "02-humaneval.json.gz"])[0]
    assert atlas.models["draft_vocab"] == 0
    assert talon_row([atlas], RunConfig(drafter="model")).steps > 0
    assert all(t.tokens == len(atlas.output) for t in length_lesson(atlas).tracks)
