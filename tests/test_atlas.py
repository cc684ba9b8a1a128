"""The draft atlas on tiny random models (float32): replayed runs equal real runs step for step,
coverage is reported (never a silent rejection), files round-trip and bad files are refused,
and the sweep command prints what replays give."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from talon.atlas.data import Atlas, AtlasSpec, parse_atlas
from talon.atlas.loop import compare_runs
from talon.atlas.record import record_atlas
from talon.atlas.replay import replay
from talon.atlas.sweep import best_row, pareto, run_sweep
from talon.cli.main import main
from talon.cost.model import synthetic_costs
from talon.drafters.model import DraftLedger
from talon.engine.engine import Engine, generate
from talon.run_config import ConfigError, RetrievalConfig, RunConfig, SamplingConfig, TreeConfig
from talon.trace import TraceFileError
from tests.tiny import ATLAS_PROMPTS, atlas_engine


@pytest.fixture(scope="module")
def recording_engine() -> Engine:
    return atlas_engine()


@pytest.fixture(scope="module")
def recorded_atlases(recording_engine: Engine) -> list[Atlas]:
    base = RunConfig(max_new_tokens=40, draft_vocab=0)
    return [record_atlas(recording_engine, prompt, base) for prompt in ATLAS_PROMPTS]


def atlas_configs() -> list[RunConfig]:
    out = []
    for drafter in ("hybrid", "model", "retrieval"):
        for mode in ("adaptive", "static", "chain"):
            for cost_aware in (False, True):
                tree = TreeConfig(mode=mode, cost_aware=cost_aware)
                out.append(RunConfig(drafter=drafter, tree=tree, max_new_tokens=40, draft_vocab=0, cost_model="fixed"))
    wide = TreeConfig(budget=24, root_k=6, top_k=3, mu=0.02, max_depth=10, min_conf=0.0, cost_aware=False)
    out.append(RunConfig(tree=wide, max_new_tokens=40, draft_vocab=0))
    out.append(RunConfig(tree=TreeConfig(budget=6, mu=0.5, admission="confidence", cost_aware=False),
                         retrieval=RetrievalConfig(min_match=1, graft_threshold=1), max_new_tokens=40, draft_vocab=0))
    return out


@pytest.mark.parametrize("cfg", atlas_configs(), ids=lambda c: f"{c.drafter}-{c.tree.mode}-N{c.tree.budget}-"
                         f"{'cost' if c.tree.cost_aware else 'nocost'}-{c.tree.admission}")
def test_replay_equals_the_real_run(recording_engine: Engine, recorded_atlases: list[Atlas], cfg: RunConfig,
                                    monkeypatch) -> None:
    """Same trees, same draft forwards (widths), same accepted lengths, same text, for every
    drafter and tree mode, with and without cost-aware planning (planned on the same fixed cost
    model)."""
    widths: list[list[int]] = []
    taken = DraftLedger.take_timings
    monkeypatch.setattr(DraftLedger, "take_timings",
                        lambda self: widths.append([w for w, _ in self.timings]) or taken(self))
    for prompt, atlas in zip(ATLAS_PROMPTS, recorded_atlases):
        widths.clear()
        summary, steps = generate(recording_engine, prompt, cfg)
        real_widths = list(widths)
        widths.clear()
        result = replay(atlas, cfg)
        if result.exact:
            assert widths == real_widths, "the replay feeds the draft model as the real run does"
        assert result.summary.token_ids == summary.token_ids == atlas.output
        if not result.exact:
            # a request outside the recorded superset: counted, never a silent rejection; the
            # trees and accepted lengths may still agree (the missing node is cut later anyway)
            assert cfg.tree.mode == "static" or cfg.tree.budget > 16, "default-sized trees lie inside the atlas"
            assert result.coverage.first_miss
            continue
        agreement = compare_runs(steps, result.steps)
        assert agreement.equal, agreement.reason
        # accepted lengths as committed (past the end of the text the atlas cannot verify, and the
        # real run's last step is cut at max_new_tokens anyway)
        assert [len(s.new_tokens) for s in steps] == [len(s.new_tokens) for s in result.steps]
        assert [s.tokens for s in steps] == [s.tokens for s in result.steps], "the same trees"
        assert result.mat == pytest.approx(summary.mean_accepted_tokens)


def test_a_static_beam_outside_the_atlas_is_counted(recording_engine: Engine, recorded_atlases: list[Atlas]) -> None:
    cfg = RunConfig(drafter="model", tree=TreeConfig(mode="static", cost_aware=False), max_new_tokens=40, draft_vocab=0)
    for prompt, atlas in zip(ATLAS_PROMPTS, recorded_atlases):
        _, steps = generate(recording_engine, prompt, cfg)
        result = replay(atlas, cfg)
        if [s.tokens for s in steps] != [s.tokens for s in result.steps]:
            assert result.coverage.misses > 0 and result.coverage.first_miss


def test_the_atlas_is_the_reference_run(recording_engine: Engine, recorded_atlases: list[Atlas]) -> None:
    """The recording run is greedy and lossless: its text is the target's generate()."""
    for prompt, atlas in zip(ATLAS_PROMPTS, recorded_atlases):
        ids = torch.tensor([atlas.prompt_ids])
        with torch.inference_mode():
            out = recording_engine.target.model.generate(ids, do_sample=False, max_new_tokens=40,
                                               attention_mask=torch.ones_like(ids))
        assert out[0, len(atlas.prompt_ids):].tolist() == atlas.output
        assert atlas.record["entries"] == len(atlas.children) > len(atlas.output)


def test_a_recording_reports_every_step_of_its_run(recording_engine: Engine) -> None:
    """Progress at every step of the greedy run, then the cost curves, then the drafting, never
    going back: a slow forward is seen moving (the app's progress bar, the command's log)."""
    events: list[tuple[float, str]] = []
    atlas = record_atlas(recording_engine, ATLAS_PROMPTS[0], RunConfig(max_new_tokens=16, draft_vocab=0),
                         progress=lambda f, what: events.append((f, what)))
    running = [what for _, what in events if what.startswith("running the target for its greedy text:")]
    assert len(running) == len(atlas.record["run_accept_lens"]) > 1
    assert running[-1].startswith(f"running the target for its greedy text: {len(atlas.output)} of at most 16")
    fractions = [f for f, _ in events]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert any("cost curves" in what for _, what in events)


def test_predicted_time_is_the_cost_model(recorded_atlases: list[Atlas]) -> None:
    atlas = recorded_atlases[0]
    costs = atlas.cost_model()
    alone = replay(atlas, RunConfig(drafter="retrieval", tree=TreeConfig(cost_aware=False), max_new_tokens=40,
                                    draft_vocab=0))
    expected = sum(costs.verify_s(len(s.tokens)) + costs.other_s for s in alone.steps)
    assert alone.predicted_s == pytest.approx(expected)
    assert alone.summary.tokens_per_second == pytest.approx(len(atlas.output) / expected)
    hybrid = replay(atlas, RunConfig(tree=TreeConfig(cost_aware=False), max_new_tokens=40, draft_vocab=0))
    for step in hybrid.steps:
        assert step.verify_s == pytest.approx(costs.verify_s(len(step.tokens)))
        assert step.draft_s >= step.draft_forwards * costs.draft_s(1) > 0
    assert hybrid.predicted_s == pytest.approx(sum(s.draft_s + s.verify_s + s.other_s for s in hybrid.steps))


def test_requests_beyond_the_atlas_are_counted_not_rejected(recording_engine: Engine) -> None:
    small = AtlasSpec(n_nodes=4, root_k=2, top_k=1, max_depth=3)
    atlas = record_atlas(recording_engine, ATLAS_PROMPTS[1], RunConfig(max_new_tokens=24, draft_vocab=0), spec=small)
    inside = replay(atlas, RunConfig(drafter="model",
                                     tree=TreeConfig(mode="chain", budget=2, max_depth=2, cost_aware=False),
                                     max_new_tokens=24, draft_vocab=0))
    assert inside.exact and inside.coverage.requests > 0
    wide = RunConfig(drafter="model", tree=TreeConfig(budget=16, root_k=4, top_k=2, max_depth=8, cost_aware=False),
                     max_new_tokens=24, draft_vocab=0)
    outside = replay(atlas, wide)
    assert not outside.exact and outside.coverage.misses > 0 and outside.coverage.share < 1
    assert "children asked" in outside.coverage.first_miss
    assert outside.summary.token_ids == atlas.output, "a miss never changes the text"


def test_atlas_file_round_trip(recorded_atlases: list[Atlas], tmp_path: Path) -> None:
    atlas = recorded_atlases[0]
    again = parse_atlas(json.loads(json.dumps(atlas.to_dict())))
    assert again.children == atlas.children, "q reads back as the very float32 the draft produced"
    assert again.output == atlas.output and again.prompt_ids == atlas.prompt_ids
    assert again.spec == atlas.spec and again.costs == atlas.costs
    cfg = RunConfig(max_new_tokens=40, draft_vocab=0, cost_model="fixed")
    assert [s.tokens for s in replay(again, cfg).steps] == [s.tokens for s in replay(atlas, cfg).steps]


@pytest.mark.parametrize("breakage, message", [
    (lambda d: d.update(format="talon-trace/1"), "not a draft atlas"),
    (lambda d: d.update(output=[-1]), "non-negative token ids"),
    (lambda d: d["children"][0].__setitem__(3, [2.0] * len(d["children"][0][2])), "probability"),
    (lambda d: d["children"][0].__setitem__(0, 10**6), "p must be"),
    (lambda d: d.update(children="x"), "'children'"),
    (lambda d: d.update(token_texts={"1": 5}), "token_texts"),
    (lambda d: d.update(spec={"n_nodes": 0}), "spec"),
])
def test_bad_atlas_files_are_refused_with_a_reason(recorded_atlases: list[Atlas], breakage, message: str) -> None:
    data = json.loads(json.dumps(recorded_atlases[0].to_dict()))
    breakage(data)
    with pytest.raises(TraceFileError, match=message):
        parse_atlas(data)


def test_replay_refuses_what_it_cannot_replay(recorded_atlases: list[Atlas]) -> None:
    with pytest.raises(ConfigError, match="greedy only"):
        replay(recorded_atlases[0], RunConfig(sampling=SamplingConfig(temperature=0.7), draft_vocab=0))
    with pytest.raises(ConfigError, match="draft_vocab"):
        replay(recorded_atlases[0], RunConfig(draft_vocab=1000))


def test_sweep_rows_are_replays(recorded_atlases: list[Atlas]) -> None:
    grid = [({"mu": mu, "budget": n}, RunConfig(tree=TreeConfig(mu=mu, budget=n, cost_aware=True), max_new_tokens=40,
                                                draft_vocab=0)) for mu in (0.05, 0.3) for n in (4, 16)]
    rows = run_sweep(recorded_atlases, grid, workers=2)
    for row, (_, cfg) in zip(rows, grid):
        results = [replay(a, cfg) for a in recorded_atlases]
        tokens = sum(len(r.summary.token_ids) for r in results)
        assert row.mat == pytest.approx(tokens / sum(r.summary.steps for r in results))
        assert row.predicted_s == pytest.approx(sum(r.predicted_s for r in results))
    best = best_row(rows)
    assert best.tokens_per_s == max(r.tokens_per_s for r in rows)
    front = pareto(rows)
    assert best in front or any(r.mat >= best.mat and r.step_s <= best.step_s for r in front)
    for r in rows:
        dominated = any(o.mat > r.mat and o.step_s < r.step_s for o in rows)
        assert (r in front) != dominated or not dominated


def test_sweep_command(recorded_atlases: list[Atlas], tmp_path: Path, capsys, caplog) -> None:
    for i, atlas in enumerate(recorded_atlases):
        (tmp_path / f"a{i}.json").write_text(json.dumps(atlas.to_dict()), encoding="utf-8")
    rc = main(["atlas", "sweep", str(tmp_path), "--grid", "mu=0.05,0.3", "--grid", "budget=4,16",
               "--draft-vocab", "0", "--max-new-tokens", "40", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["rows"]) == 4 and len(out["atlases"]) == 2
    for row in out["rows"]:
        cfg = RunConfig.from_dict(row["config"])
        assert (cfg.tree.mu, cfg.tree.budget) == (row["values"]["mu"], row["values"]["budget"])
        assert row["per_atlas"][0]["mat"] == pytest.approx(replay(recorded_atlases[0], cfg).mat)
    assert main(["atlas", "sweep", str(tmp_path), "--grid", "colour=red"]) == 2
    assert main(["atlas", "sweep", str(tmp_path), "--grid", "budget=0", "--draft-vocab", "0"]) == 2
    assert main(["atlas", "sweep", str(tmp_path / "nothing.json")]) == 2
    slow = synthetic_costs({1: 1.0, 64: 2.0}, {1: 0.5, 64: 0.6}).to_dict()
    (tmp_path / "costs.txt").write_text(json.dumps(slow), encoding="utf-8")
    capsys.readouterr()
    assert main(["atlas", "sweep", str(tmp_path / "a0.json"), "--costs", str(tmp_path / "costs.txt"),
                 "--draft-vocab", "0", "--max-new-tokens", "40", "--cost-aware", "off", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    atlas = dataclasses.replace(recorded_atlases[0], costs=slow)
    assert row["predicted_s"] == pytest.approx(replay(atlas, RunConfig.from_dict(row["config"])).predicted_s)
    assert row["predicted_s"] > 1.0 * row["steps"], "timed on the given host's curves"
    assert main(["atlas", "sweep", str(tmp_path / "a0.json"), "--costs", str(tmp_path / "a1.json")]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "KEY=V1,V2" in errors[0] and "budget must be" in errors[1] and "nothing.json" in errors[2]
    assert "not a talon-cost/1 file" in errors[3]


def test_bench_records_an_atlas_per_prompt(recording_engine: Engine, tmp_path: Path) -> None:
    """``python -m talon.bench --atlas``: one atlas per prompt, whose text is the ar row's output."""
    from talon.bench import BenchConfig, load_prompts, run_bench

    data = tmp_path / "data"
    data.mkdir()
    for suite, texts in {"humaneval": ["def add(a, b):", "def fib(n):"], "qa": ["who wrote hamlet?"]}.items():
        lines = [json.dumps({"question_id": i, "turns": [t]}) for i, t in enumerate(texts)]
        (data / f"{suite}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    prompts = load_prompts(data, ["humaneval", "qa"], limit=2)
    cfg = BenchConfig(methods=("ar",), max_new_tokens=10, warmup_tokens=0, atlas=True)
    report = run_bench(recording_engine, prompts, cfg, out=tmp_path / "out")
    files = sorted((tmp_path / "out" / "atlases").glob("*.json"))
    assert [f.name for f in files] == ["humaneval-0.json", "humaneval-1.json", "qa-0.json"]
    ar = {(s.prompt.suite, s.prompt.index): s.outcome.token_ids for s in report.samples if s.spec.method == "ar"}
    for f in files:
        atlas = parse_atlas(json.loads(f.read_text()))
        assert atlas.suite == f.name.split("-")[0] and len(atlas.output) == 10
        assert atlas.output == ar[(atlas.suite, int(f.stem.split("-")[1]))]
        assert replay(atlas, RunConfig(max_new_tokens=10)).summary.token_ids == atlas.output
