"""The engines' own drafting replayed from atlases (talon/atlas/serving_replay.py): each policy against a
hand computation from the engine's source, vLLM's draft_model against a live run of the tiny draft
model, the engine counters, engine cost files and the ``atlas sweep --engine`` command."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

from talon.atlas.data import Atlas, parse_atlas
from talon.atlas.forecast import forecast
from talon.atlas.record import record_atlas
from talon.atlas.replay import replay
from talon.atlas.serving import serving_config
from talon.atlas.serving_costs import (
    ServingCosts,
    TalonCurves,
    fit_serving_costs,
    parse_serving_costs,
    predicted_seconds,
)
from talon.atlas.serving_replay import SglangStandalone, VllmDraftModel, VllmNgram, lookup_draft, replay_serving
from talon.atlas.serving_sweep import parse_serving_grid, serving_policies, sweep_serving
from talon.cli.main import main
from talon.cost.model import CostModel
from talon.engine.engine import Engine
from talon.run_config import ConfigError, RunConfig
from talon.trace import TraceFileError
from tests.tiny import atlas_engine

# --------------------------------------------------------------------------- hand-built atlases

SERVED_TEXT = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]


def chain_atlas(wrong: dict[int, int], near_tie_at: int | None = None) -> Atlas:
    """An atlas whose draft predicts the text's next token everywhere but at ``wrong`` positions
    (p -> the token it predicts instead)."""
    children = {}
    for p in range(len(SERVED_TEXT) + 1):
        right = SERVED_TEXT[p] if p < len(SERVED_TEXT) else 99
        top = wrong.get(p, right)
        second = 50 + p if top == right else right
        q2 = 0.49995 if p == near_tie_at else 0.2
        children[(p, ())] = [(top, 0.5), (second, q2)]
    return Atlas(prompt_ids=[1, 2, 3], output=list(SERVED_TEXT), children=children, eos=[0])


def test_vllm_draft_model_matches_a_hand_computation() -> None:
    """The draft is wrong at p=2 (97) and p=5 (96); max_tokens 8, k=2:
    p=1: 11 ok, 97 no -> 1 accepted, p=3; p=3: 13, 14 -> 2, p=6; p=6: 16, 17 -> 2, p=9 >= 8: done.
    vLLM counts the last step's 2 accepted although the output is cut at 8 tokens."""
    atlas = chain_atlas({2: 97, 5: 96})
    run = replay_serving(atlas, VllmDraftModel(2), max_tokens=8)
    assert [(s.p, s.drafted, s.accepted) for s in run.steps] == [(1, 2, 1), (3, 2, 2), (6, 2, 2)]
    assert (run.num_drafts, run.num_draft_tokens, run.num_accepted_tokens) == (3, 6, 5)
    assert run.accepted_per_position(2) == [3, 2]
    assert run.output_tokens == 8 and run.exact and not run.near_ties
    # k=3: p=1: 11, 97 -> 1; p=3: 13, 14, 96 -> 2; p=6: 16, 17, 18 -> 3, p=10: done
    run3 = replay_serving(atlas, VllmDraftModel(3), max_tokens=8)
    assert [s.accepted for s in run3.steps] == [1, 2, 3]
    assert (run3.num_draft_tokens, run3.accepted_per_position(3)) == (9, [3, 2, 1])


def test_vllm_draft_model_reports_near_ties_and_text_beyond_the_recording() -> None:
    tied = replay_serving(chain_atlas({2: 97}, near_tie_at=3), VllmDraftModel(2), max_tokens=8)
    assert any("token 3" in t for t in tied.near_ties)
    # replayed to the recording's end, the last draft runs past the text: a miss, not a rejection
    full = replay_serving(chain_atlas({}), VllmDraftModel(3))  # p = 1, 5, 9: the last runs past
    assert full.misses == 1 and "past the 10 recorded tokens" in full.steps[-1].missing


def brute_lookup(ctx: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """vLLM's prompt lookup by its definition: for every earlier start s, the longest n <= max_n
    (and s + n <= len - 1) with ctx[s:s+n] == the last n tokens; the longest wins, then the earliest."""
    best_n, best_s = 0, 0
    for s in range(len(ctx) - 1):
        n = max((m for m in range(1, min(max_n, len(ctx) - 1 - s) + 1) if ctx[s:s + m] == ctx[len(ctx) - m:]),
                default=0)
        if n > best_n:
            best_n, best_s = n, s
    return ctx[best_s + best_n: best_s + best_n + k] if best_n >= min_n else []


@pytest.mark.parametrize("ctx, min_n, max_n, k, expected", [
    ([1, 2, 3, 4, 1, 2, 3], 1, 3, 2, [4, 1]),       # the 3-token suffix occurred at the start
    ([5, 1, 2, 9, 1, 2, 7, 1, 2], 1, 3, 2, [9, 1]),  # [1, 2] twice before: the earliest wins
    ([1, 2, 3, 4], 1, 3, 2, []),                     # the last token never occurred before
    ([7, 7, 7, 7], 1, 3, 2, [7]),                    # an overlapping occurrence; cut at the end
    ([3, 1, 2, 3, 1, 2], 3, 5, 4, [3, 1, 2]),        # [3, 1, 2] (n=3) beats shorter matches
    ([1, 2, 9, 2], 2, 4, 3, []),                     # only a 1-token match: below min_n
])
def test_vllm_ngram_matches_hand_computations(ctx, min_n, max_n, k, expected) -> None:
    assert lookup_draft(ctx, min_n, max_n, k) == expected
    assert brute_lookup(ctx, min_n, max_n, k) == expected


def test_vllm_ngram_equals_its_definition_on_random_text() -> None:
    rng = random.Random(7)
    for _ in range(300):
        ctx = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        lo = rng.randrange(1, 4)
        hi = rng.randrange(lo, 7)
        assert lookup_draft(ctx, lo, hi, 5) == brute_lookup(ctx, lo, hi, 5), (ctx, lo, hi)


def test_vllm_ngram_steps_without_a_match_are_not_drafts() -> None:
    atlas = Atlas(prompt_ids=[1, 2, 3, 1, 2], output=[3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 0], children={(0, ()): []},
                  eos=[0])
    run = replay_serving(atlas, VllmNgram(3, 2, 3))
    # p=1: context ..1 2 3 -> [1 2 3] at 0 -> drafts 1 2 3 (text 4 5 6): 0 accepted
    assert run.steps[0].drafted == 3 and run.steps[0].accepted == 0
    assert run.num_drafts < len(run.steps), "steps that found no match are plain steps, not drafts"
    assert run.output_tokens == len(atlas.output)  # stopped at EOS


# SGLang's tree on a hand-built example (ids: A=20, B=21, A1=30, A2=31, B1=32, B2=33, B1a=40, ...)
def sglang_atlas() -> Atlas:
    children = {
        (1, ()): [(20, 0.6), (21, 0.35)],          # root: A .6, B .35
        (1, (20,)): [(30, 0.5), (31, 0.4)],        # A1 .30, A2 .24
        (2, ()): [(32, 0.9), (33, 0.05)],          # B1 .315, B2 .0175 (B follows the text)
        (3, ()): [(40, 0.8), (41, 0.1)],           # B1a .252, B1b .0315
        (1, (20, 30)): [(42, 0.5), (43, 0.1)],     # A1a .15, A1b .03
    }
    return Atlas(prompt_ids=[1, 2], output=[5, 21, 32, 40, 7, 8], children=children, eos=[0])


def test_sglang_standalone_tree_matches_a_hand_computation() -> None:
    """topk 2, 3 steps: candidates A .6, B .35 | A1 .30, A2 .24, B1 .315, B2 .0175 (frontier B1,
    A1) | B1a .252, B1b .0315, A1a .15, A1b .03. With 5 draft tokens the best 4 are A, B, B1, A1:
    the text B B1 B1a accepts B, B1 (2). With 6, B1a joins: 3."""
    atlas = sglang_atlas()
    draft = SglangStandalone(2, 3, 5).propose(atlas, 1)
    assert sorted(draft.tokens) == [20, 21, 30, 32]
    assert draft.parents[draft.tokens.index(32)] == draft.tokens.index(21)
    run = replay_serving(atlas, SglangStandalone(2, 3, 5), max_tokens=4)
    assert [s.accepted for s in run.steps] == [2] and run.output_tokens == 4
    wider = replay_serving(atlas, SglangStandalone(2, 3, 6), max_tokens=4)
    assert [s.accepted for s in wider.steps] == [3]
    # spec_accept_length = completion tokens / verify steps, the prefill's token included
    rows = sweep_serving([atlas], [({}, SglangStandalone(2, 3, 5))], ServingCosts("sglang", 0.1), max_tokens=4)
    assert rows[0].spec_accept_length == 4.0


def test_sglang_refuses_what_sglang_refuses_and_counts_misses() -> None:
    with pytest.raises(ConfigError, match="num_steps \\+ 1"):
        SglangStandalone(1, 3, 3)
    with pytest.raises(ConfigError, match="num_draft_tokens"):
        SglangStandalone(2, 2, 8)  # at most 2 + 4 candidates
    run = replay_serving(sglang_atlas(), SglangStandalone(3, 2, 4), max_tokens=4)  # 3 children: the atlas holds 2
    assert run.misses == len(run.steps) and "fewer" in run.steps[0].missing


# --------------------------------------------------------------------------- a live tiny model



@pytest.fixture(scope="module")
def tiny() -> tuple[Engine, Atlas]:
    engine = atlas_engine()
    atlas = record_atlas(engine, "def add(a, b): return a + b\ndef sub(a, b):",
                         RunConfig(max_new_tokens=40, draft_vocab=0))
    return engine, atlas


@torch.inference_mode()
def live_draft_model_run(engine: Engine, atlas: Atlas, k: int) -> list[tuple[int, int]]:
    """vLLM's draft_model loop run with the tiny draft model itself: every step a greedy chain of k
    from full forwards over the committed context, checked against the target's greedy text."""
    draft, out, steps, p = engine.draft.model, atlas.output, [], 1
    while p < len(out) - k - 1:
        ctx = list(atlas.prompt_ids) + out[:p]
        chain = []
        for _ in range(k):
            logits = draft(torch.tensor([ctx + chain])).logits[0, -1]
            chain.append(int(logits.argmax()))
        accepted = 0
        while accepted < k and chain[accepted] == out[p + accepted]:
            accepted += 1
        steps.append((len(chain), accepted))
        p += accepted + 1
    return steps


@pytest.mark.parametrize("k", [1, 3, 5])
def test_vllm_draft_model_replay_equals_the_live_draft_model(tiny, k: int) -> None:
    engine, atlas = tiny
    live = live_draft_model_run(engine, atlas, k)
    run = replay_serving(atlas, VllmDraftModel(k), max_tokens=None)
    replayed = [(s.drafted, s.accepted) for s in run.steps][: len(live)]
    assert replayed == live
    assert sum(a for _, a in live) > 0, "the noisy draft accepts something, or the test shows nothing"


def test_sglang_replay_on_a_recorded_atlas_is_covered_for_narrow_trees(tiny) -> None:
    _, atlas = tiny
    run = replay_serving(atlas, SglangStandalone(2, 4, 8))
    assert run.exact, "the atlas's static beam of width 2 records every node a topk-2 tree asks for"
    assert run.num_accepted_tokens > 0


# --------------------------------------------------------------------------- costs and the sweep


def test_engine_costs_fit_recovers_known_coefficients() -> None:
    truth = ServingCosts("vllm", step_s=0.02, verify_token_s=0.01, draft_forward_s=0.03)
    samples = []
    for method, k, steps in (("draft_model", 1, 30), ("draft_model", 4, 18), ("ngram", 2, 40), ("ngram", 8, 35)):
        forwards = k * steps if method == "draft_model" else 0
        verified = steps * (k + 1)
        samples.append({"steps": steps, "verified_tokens": verified, "draft_forwards": forwards,
                        "decode_s": (truth.step_s * steps + truth.verify_token_s * verified
                                     + truth.draft_forward_s * forwards),
                        "prefill_s": 0.5 if method == "ngram" else 0.7, "prompt_tokens": 100,
                        "draft_model": int(method == "draft_model")})
    fit = fit_serving_costs(samples, "vllm")
    for name in ("step_s", "verify_token_s", "draft_forward_s"):
        assert math.isclose(getattr(fit, name), getattr(truth, name), rel_tol=1e-6), name
    assert math.isclose(fit.prefill_token_s, 0.005) and math.isclose(fit.draft_prefill_token_s, 0.002)
    again = parse_serving_costs(json.loads(json.dumps(fit.to_dict())))
    assert again.step_seconds(3, 3) == fit.step_seconds(3, 3)


@pytest.mark.parametrize("breakage, message", [
    (lambda d: d.update(step_s=-0.1), "step_s"),
    (lambda d: d.update(verify_token_s=float("nan")), "verify_token_s"),
    (lambda d: d.update(engine="tgi"), "engine"),
    (lambda d: d.update(format="talon-cost/1"), "not an engine cost file"),
    (lambda d: d.update(step_s=0, verify_token_s=0), "must cost something"),
])
def test_bad_engine_cost_files_are_refused(breakage, message: str) -> None:
    data = ServingCosts("vllm", 0.05, 0.01).to_dict()
    breakage(data)
    with pytest.raises(ValueError, match=message):
        parse_serving_costs(data)


@pytest.mark.parametrize("field, value, message", [
    ("verify_s", -0.1, "verify_s at size 1 must be a finite, positive"),
    ("draft_s", float("inf"), "draft_s at size 1"),
    ("verify_s", 0.0, "positive"),
])
def test_cost_curves_must_be_finite_positive_times(tiny, field: str, value: float, message: str,
                                                   tmp_path: Path) -> None:
    """An atlas or a --costs file with a negative, infinite or zero time is refused, not replayed
    at a negative step time and 0 tokens/s."""
    _, atlas = tiny
    data = json.loads(json.dumps(atlas.to_dict()))
    data["costs"][field][0] = value
    with pytest.raises(ValueError, match=message):
        CostModel.from_dict(data["costs"])
    with pytest.raises(TraceFileError, match=message):
        parse_atlas(data)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(atlas.to_dict()))
    bad_costs = tmp_path / "costs.json"
    bad_costs.write_text(json.dumps(data["costs"]), encoding="utf-8")
    assert main(["atlas", "sweep", str(good), "--costs", str(bad_costs)]) == 2


def test_predicted_time_adds_the_engine_steps(tiny) -> None:
    _, atlas = tiny
    run = replay_serving(atlas, VllmDraftModel(3))
    costs = ServingCosts("vllm", step_s=0.01, verify_token_s=0.002, draft_forward_s=0.004, prefill_token_s=0.001)
    expected = 0.001 * len(atlas.prompt_ids) + sum(0.01 + 0.002 * (s.drafted + 1) + 0.004 * 3 for s in run.steps)
    assert math.isclose(predicted_seconds(run, costs), expected)
    curves = TalonCurves(atlas.cost_model())
    assert math.isclose(predicted_seconds(run, curves), sum(
        atlas.cost_model().verify_s(s.drafted + 1) + 3 * atlas.cost_model().draft_s(1) + atlas.cost_model().other_s
        for s in run.steps))


def test_engine_grid_follows_the_engines_rules() -> None:
    grid = parse_serving_grid("sglang", ["topk=1,2", "num_steps=2", "num_draft_tokens=8"])
    policies = [p for _, p in serving_policies("sglang", grid)]
    assert [(p.topk, p.num_draft_tokens) for p in policies] == [(1, 3), (2, 7)], \
        "topk 1 forces steps + 1; 8 draft tokens are capped at the tree's 2 + 4 candidates + 1"
    with pytest.raises(ConfigError, match="suffix"):
        parse_serving_grid("vllm", ["method=suffix"])
    with pytest.raises(ConfigError, match="KEY one of"):
        parse_serving_grid("vllm", ["topk=2"])


def test_sweep_engine_command(tiny, tmp_path: Path, capsys) -> None:
    _, atlas = tiny
    path = tmp_path / "a.json"
    path.write_text(json.dumps(atlas.to_dict()))
    assert main(["atlas", "sweep", str(path), "--engine", "vllm", "--grid", "k=1,2,4", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    direct = replay_serving(atlas, VllmDraftModel(2), len(atlas.output) - 5)  # k up to 4: stop 5 before the end
    row = next(r for r in rows if r["knobs"] == {"method": "draft_model", "k": 2})
    assert row["num_accepted_tokens"] == direct.num_accepted_tokens and row["num_drafts"] == direct.num_drafts
    assert math.isclose(row["mean_acceptance_length"], 1 + direct.num_accepted_tokens / direct.num_drafts)
    costs = tmp_path / "vllm-costs.json"
    costs.write_text(json.dumps(ServingCosts("vllm", 0.05, 0.01, 0.02, hardware="test host").to_dict()))
    assert main(["atlas", "sweep", str(path), "--engine", "vllm", "--grid", "method=draft_model",
                 "--grid", "k=1,2", "--costs", str(costs)]) == 0
    out = capsys.readouterr().out
    assert "mean acceptance length" in out and "measured on test host" in out and "best by predicted" in out
    assert main(["atlas", "sweep", str(path), "--engine", "sglang", "--costs", str(costs)]) == 2


def test_forecast_replays_the_exported_flags(tiny) -> None:
    """The Serve it tab's numbers are the replays of the exported flags, in each engine's terms."""
    _, atlas = tiny
    cfg = RunConfig(drafter="model", max_new_tokens=40, draft_vocab=0, cost_model="fixed")
    exported = serving_config(cfg, "a/target", "a/draft")
    result = forecast(atlas, cfg, exported)
    k = exported.vllm_config["num_speculative_tokens"]
    vllm = replay_serving(atlas, VllmDraftModel(k), len(atlas.output) - k - 1)
    rows = {engine: row for engine, row, _ in result.exported}
    assert rows["vLLM"].num_accepted == vllm.num_accepted_tokens and rows["vLLM"].num_drafts == vllm.num_drafts
    flags = dict(zip(exported.sglang_flags[0::2], exported.sglang_flags[1::2]))
    steps = int(flags["--speculative-num-steps"])
    sglang = replay_serving(atlas, SglangStandalone(int(flags["--speculative-eagle-topk"]), steps,
                                                   int(flags["--speculative-num-draft-tokens"])),
                           len(atlas.output) - steps - 1)
    assert math.isclose(rows["SGLang"].spec_accept_length, sglang.output_tokens / len(sglang.steps))
    mine = replay(atlas, cfg)
    assert result.talon_mat == pytest.approx(mine.mat)
    assert result.talon_rate == pytest.approx(len(mine.summary.token_ids) / mine.predicted_s)
    text = result.markdown()
    assert f"mean acceptance length {rows['vLLM'].acceptance:.2f}" in text and "Best engine settings" in text
    retrieval = forecast(atlas, cfg.replace(drafter="retrieval"),
                         serving_config(cfg.replace(drafter="retrieval"), "t", None))
    assert "vLLM suffix" in retrieval.markdown() and "not replayed" in retrieval.markdown()
    assert "vLLM ngram" in retrieval.markdown()
    assert "Threshold explorer" in forecast(None, cfg, exported).markdown()
