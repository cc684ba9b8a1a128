"""The benchmark harness on tiny random models (float32): every method runs interleaved, the
report matches its schema, Talon methods are lossless, corrupted outputs are caught."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import talon.core.verify
from talon.bench import (
    BenchConfig,
    SweepConfig,
    TieJudge,
    first_divergence,
    load_prompts,
    run_bench,
    sweep_runners,
    talon_variant,
    tie_tolerance,
)
from talon.bench.command import main
from talon.bench.options import DEFAULT_METHODS
from talon.cost.model import synthetic_costs
from talon.engine.engine import Engine, generate
from talon.run_config import ConfigError, RunConfig, TreeConfig
from talon.specbench import SuiteError
from tests.tiny import noisy_copy, tiny_loaded

SUITE_TEXTS = {
    "humaneval": ["def add(a, b):", "def fib(n):\n    ", "def is_even(n):"],
    "sum": ["Summarize: the cat sat on the mat. the cat sat.", "Summarize: one two one two one", "x y z"],
    "qa": ["who wrote hamlet?"],
}
ROW_KEYS = {
    "suite", "method", "prompts", "new_tokens", "mat", "tokens_per_second", "speedup_vs_ar", "lossless",
    "near_ties", "mismatches", "draft_s", "verify_s", "other_s", "settings", "free_draft_bound", "bound_share",
}
FAST = {"max_new_tokens": 12, "hf_assistant_tokens": ("4", "default"), "warmup_tokens": 2}


@pytest.fixture(scope="module")
def bench_pair():
    target = tiny_loaded("llama", 11, layers=3)  # layerskip, one of the methods, keeps the first and last layer
    return target, noisy_copy(target, 12, 0.3)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("specbench")
    for suite, texts in SUITE_TEXTS.items():
        lines = [json.dumps({"question_id": i, "turns": [t, "a second turn"]}) for i, t in enumerate(texts)]
        (root / f"{suite}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def full_run(bench_pair, data_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    target, draft = bench_pair
    prompts = load_prompts(data_dir, ["humaneval", "sum"], limit=2)
    out = tmp_path_factory.mktemp("bench-out")
    report = run_bench(Engine(target, draft), prompts, BenchConfig(**FAST), out=out, command="pytest")
    return report, out


def test_every_method_runs_and_the_report_matches_the_schema(full_run) -> None:
    _, out = full_run
    data = json.loads((out / "results.json").read_text())
    env_keys = {"cpu", "cores", "torch_threads", "dtype", "device", "torch", "transformers", "date", "command"}
    assert env_keys <= set(data["env"])
    rows = data["results"]
    assert all(set(r) >= ROW_KEYS for r in rows)
    assert all("mu" not in r for r in rows)
    assert {(r["suite"], r["method"]) for r in rows} == {
        (s, m) for s in ("humaneval", "sum", "all") for m in DEFAULT_METHODS  # llama.cpp's: test_llamacpp
    }
    assert all(r["prompts"] == (4 if r["suite"] == "all" else 2) for r in rows)
    md = (out / "results.md").read_text()
    assert "| **all** |" in md and "Biggest remaining cost" in md
    assert "talon bound | share | talon vs generate() |" in md and "## How close to the limit" in md
    by = {(r["suite"], r["method"]): r for r in rows}
    vs_generate = by[("all", "talon")]["tokens_per_second"] / by[("all", "hf-greedy")]["tokens_per_second"]
    assert md.split("| **all** |")[1].split("\n")[0].rstrip(" |").endswith(f"{vs_generate:.2f}x")
    for r in rows:  # every drafting Talon method has a bound; HF methods have none
        talon_engine = not r["method"].startswith("hf-")
        assert (r["free_draft_bound"] is not None) == talon_engine
        if talon_engine:
            assert r["bound_share"] == pytest.approx(r["speedup_vs_ar"] / r["free_draft_bound"])
    assert all(r["free_draft_bound"] == pytest.approx(1.0) for r in rows if r["method"] == "ar")
    assert (out / "speedup.html").is_file() and (out / "time_split.html").is_file()


def test_every_token_is_checked_and_talon_methods_are_lossless(full_run) -> None:
    report, _ = full_run
    rate = {(r.suite, r.method): r.tokens_per_second for r in report.rows}
    for row in report.rows:
        assert row.speedup_vs_ar == pytest.approx(row.tokens_per_second / rate[(row.suite, "ar")])
        assert row.new_tokens > 0 and row.tokens_per_second > 0
    ar_mat = {r.mat for r in report.rows if r.method == "ar"}
    assert ar_mat == {1.0}, "plain decoding commits one token per target forward"
    # Every position of every output went through the judge, hf-greedy (transformers) included.
    assert sum(c.check.positions for c in report.checks) == sum(len(s.outcome.token_ids) for s in report.samples)
    assert {c.method for c in report.checks} >= {"ar", "hf-greedy", "talon"}
    talon_rows = [r for r in report.rows if not r.method.startswith("hf-")]
    assert all(r.lossless and r.mismatches == 0 for r in talon_rows)
    assert not report.fatal
    by_method = {(s.prompt.suite, s.prompt.index, s.spec.name): s.outcome.token_ids for s in report.samples}
    for (suite, index, method), ids in by_method.items():
        if method == "hf-greedy":  # float32 on tiny models: transformers' greedy is ar's, token for token
            assert ids == by_method[(suite, index, "ar")]
    assert any(r.mat and r.mat > 1.0 for r in talon_rows), "a close draft model must get drafts accepted"
    split = next(r for r in report.rows if r.method == "talon" and r.suite == "all")
    parts = split.draft_s + split.verify_s + split.other_s + split.setup_s
    assert parts == pytest.approx(split.seconds)


def test_hf_methods_count_forwards_and_name_the_best_variant(full_run) -> None:
    report, _ = full_run
    for row in report.rows:
        if row.method == "hf-assisted":
            assert row.settings["variant"] in ("4", "default")
            assert set(row.settings["variants"]) == {"4", "default"}
        if row.method.startswith("hf-"):
            assert row.mat is not None and row.mat >= 1.0
            assert row.draft_s is None


def greedy_ids(target, ids: list[int], n: int) -> list[int]:
    """The target's own greedy continuation of token ids ``ids`` (n new tokens)."""
    summary, _ = generate(Engine(target, None), ids, RunConfig(drafter="none", max_new_tokens=n))
    return summary.token_ids


def test_every_token_is_checked_past_a_near_tie(bench_pair) -> None:
    """An output that takes the runner-up at a near-tie and later departs for real: the old judge
    stopped at the near-tie and called it lossless; every token is checked now."""
    target, _ = bench_pair
    prompt = target.tokenizer("def add(a, b):")["input_ids"]
    ar = greedy_ids(target, prompt, 10)
    judge = TieJudge(target, abs_tol=1e-3)
    assert judge.check(prompt, ar, 10, {256}).lossless and judge.check(prompt, ar).near_ties == []
    logits = judge.output_logits(prompt, ar)  # (10, V)
    runner_up = int(logits[2].topk(2).indices[1])
    tie_gap = (logits[2].max() - logits[2, runner_up]).item()
    tied = ar[:2] + [runner_up]
    tied += greedy_ids(target, prompt + tied, 10 - len(tied))  # lossless: the tie taken, then greedy
    loose = TieJudge(target, abs_tol=tie_gap + 1e-4)  # position 2 is within the tolerance
    ok = loose.check(prompt, tied, 10, {256})
    assert ok.lossless and ok.near_ties == [2] and ok.positions == 10
    worst = int(loose.output_logits(prompt, tied)[6].argmin())
    planted = tied[:6] + [worst]
    planted += greedy_ids(target, prompt + planted, 10 - len(planted))
    bad = loose.check(prompt, planted, 10, {256})
    assert bad.near_ties == [2] and not bad.lossless
    m = bad.first_mismatch
    assert m.position == 6 and m.token == worst and m.best_token == tied[6] and m.logit_gap > m.tolerance
    assert TieJudge(target, abs_tol=1e9).check(prompt, planted).lossless  # an infinite tolerance excuses all


def test_stopping_early_or_after_eos_is_a_mismatch(bench_pair) -> None:
    target, _ = bench_pair
    prompt = target.tokenizer("def add(a, b):")["input_ids"]
    ar = greedy_ids(target, prompt, 8)
    judge = TieJudge(target, abs_tol=1e-3)
    assert judge.check(prompt, ar[:5], 8, {256}).first_mismatch.reason == "stopped early"
    assert judge.check(prompt, ar[:5]).lossless  # no length expected: only the tokens are checked
    assert not judge.check(prompt, [], 8).lossless


def test_the_judge_says_when_it_could_not_judge_in_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """A half-precision target is judged on a float32 copy; where the copy cannot be made the
    judge runs in the target's own dtype and says so (the report prints it), never silently."""
    import talon.bench.judge as judge_module

    target = tiny_loaded("llama", 3)
    half = type(target)(target.model.to(torch.bfloat16), target.tokenizer, target.name, torch.bfloat16, target.device)
    prompt, out = [5, 9, 77], greedy_ids(half, [5, 9, 77], 4)
    judge = TieJudge(half, abs_tol=0.05)
    assert judge.check(prompt, out).positions == 4 and judge.precision == "float32"

    def no_room(_: object) -> object:
        raise RuntimeError("not enough memory")

    monkeypatch.setattr(judge_module.copy, "deepcopy", no_room)
    fallback = TieJudge(half, abs_tol=0.05)
    assert fallback.check(prompt, out).positions == 4
    assert fallback.precision == "bfloat16 (float32 copy failed: not enough memory)"


def test_a_planted_off_by_one_position_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tree verified with every draft node one position too far: the judge must flag the
    output, while the same run with correct positions passes."""
    target = tiny_loaded("llama", 11)
    with torch.no_grad():  # peaked attention, so that a position id shifts the logits visibly
        for layer in target.model.model.layers:
            layer.self_attn.q_proj.weight.mul_(6.0)
            layer.self_attn.k_proj.weight.mul_(6.0)
    draft = noisy_copy(target, 5, 0.0)  # the draft is the target: its drafts get accepted
    cfg = RunConfig(drafter="model", max_new_tokens=24, tree=TreeConfig(cost_aware=False))
    judge = TieJudge(target, abs_tol=1e-3)
    checks = {}
    for planted in (False, True):
        if planted:
            real = talon.core.verify.tree_positions
            monkeypatch.setattr(talon.core.verify, "tree_positions", lambda tree, prefix: real(tree, prefix + 1) - (
                torch.tensor(tree.depths) == 0).long())
        results = [generate(Engine(target, draft), text, cfg)[0] for text in SUITE_TEXTS["humaneval"]]
        checks[planted] = [judge.check(r.prompt_token_ids, r.token_ids, 24, {256}) for r in results]
    assert all(c.lossless for c in checks[False])
    assert any(not c.lossless for c in checks[True])


def test_tie_tolerance_scales_with_the_dtype_rounding_step() -> None:
    # bfloat16 logits near 16 move in steps of 0.125: a 0.08 fp32 gap is below one step.
    assert tie_tolerance(0.05, torch.bfloat16, 16.16) == pytest.approx(0.05 + 2 * 0.125)
    assert tie_tolerance(0.05, torch.bfloat16, -3.0) == pytest.approx(0.05 + 2 * 2**-7 * 2)
    assert tie_tolerance(1e-3, torch.float32, 16.16) == pytest.approx(1e-3, abs=1e-5)
    assert tie_tolerance(0.05, torch.bfloat16, 0.0) == 0.05


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2
    assert first_divergence([], [7]) == 0


def test_sweep_produces_the_grid(bench_pair, data_dir: Path, tmp_path: Path) -> None:
    target, draft = bench_pair
    prompts = load_prompts(data_dir, ["sum"], limit=1)
    sweep = SweepConfig(method="hybrid", mus=(0.05, 0.3), budgets=(4, 8, 12), root_ks=(3,))
    cfg = BenchConfig(methods=("ar",), max_new_tokens=8, sweep=sweep, warmup_tokens=0)
    report = run_bench(Engine(target, draft), prompts, cfg, out=tmp_path)
    cells = [r for r in report.rows if r.is_sweep and r.suite == "all"]
    assert sorted((r.mu, r.budget) for r in cells) == [(mu, n) for mu in (0.05, 0.3) for n in (4, 8, 12)]
    assert all(r.root_k == 3 and r.lossless for r in cells)
    rows = json.loads((tmp_path / "results.json").read_text())["results"]
    assert sum("mu" in r and "budget" in r for r in rows) == 2 * 6  # suite "sum" and "all"
    assert (tmp_path / "sweep.html").is_file()
    assert "## Sweep: hybrid" in (tmp_path / "results.md").read_text()
    adaptive = sweep_runners(Engine(target, draft), SweepConfig(method="adaptive", mus=(0.1,), budgets=(4, 8)))
    assert [(r.cfg.drafter, r.cfg.tree.mode, r.cfg.tree.budget) for r in adaptive] == [
        ("model", "adaptive", 4), ("model", "adaptive", 8),
    ]
    # a cell changes mu, N and K only: the method's own min_conf and cost planning stay
    assert all(r.cfg.tree.min_conf == 0.0 and not r.cfg.tree.cost_aware for r in adaptive)
    talon = sweep_runners(Engine(target, draft), SweepConfig(mus=(0.3,), budgets=(8,)))
    assert [(r.spec.method, r.cfg.drafter, r.cfg.tree.cost_aware, r.cfg.tree.min_conf, r.cfg.tree.mu)
            for r in talon] == [("talon", "hybrid", True, RunConfig().tree.min_conf, 0.3)]


def test_talon_variants_are_rows_of_their_own(bench_pair, data_dir: Path, tmp_path: Path) -> None:
    """A one-knob sweep: each --talon-variant is the default configuration with its knobs changed."""
    target, draft = bench_pair
    prompts = load_prompts(data_dir, ["sum"], limit=1)
    cfg = BenchConfig(methods=("ar",), max_new_tokens=8, warmup_tokens=0,
                      talon_variants=("top_k=1", "mu=0.3,graft_threshold=2"))
    report = run_bench(Engine(target, draft), prompts, cfg, out=tmp_path)
    rows = {r.method: r for r in report.rows if r.suite == "all"}
    assert set(rows) == {"ar", "talon[top_k=1]", "talon[mu=0.3,graft_threshold=2]"}
    assert all(r.lossless and r.new_tokens == 8 for r in rows.values())
    assert rows["talon[top_k=1]"].settings["tree"]["top_k"] == 1
    assert rows["talon[top_k=1]"].settings["tree"]["mu"] == RunConfig().tree.mu
    changed = talon_variant(RunConfig(), "mu=0.3, graft_threshold=2,cost_aware=off")
    assert (changed.tree.mu, changed.retrieval.graft_threshold, changed.tree.cost_aware) == (0.3, 2, False)
    assert changed.tree.budget == RunConfig().tree.budget
    for bad, match in (("foo=1", "key among"), ("top_k=x", "an integer"), ("mu=5", "mu"), ("", "changes nothing"),
                       ("cost_aware=maybe", "true or false"), ("top_k", "key=value")):
        with pytest.raises(ConfigError, match=match):
            talon_variant(RunConfig(), bad)
    assert main(["--data", str(data_dir), "--out", str(tmp_path), "--talon-variant", "top_k=x"]) == 2


def test_limit_and_suites_are_respected(data_dir: Path) -> None:
    prompts = load_prompts(data_dir, ["sum", "qa"], limit=2)
    assert [(p.suite, p.index) for p in prompts] == [("sum", 0), ("sum", 1), ("qa", 0)]
    assert prompts[0].text == SUITE_TEXTS["sum"][0]  # the first turn
    assert len(load_prompts(data_dir, ["humaneval"])) == 3
    later = load_prompts(data_dir, ["sum", "humaneval"], limit=1, start=1)  # skip the reported ones
    assert [(p.suite, p.index, p.text) for p in later] == [
        ("sum", 1, SUITE_TEXTS["sum"][1]), ("humaneval", 1, SUITE_TEXTS["humaneval"][1]),
    ]
    assert load_prompts(data_dir, ["sum", "qa"], start=2) == [later[0].__class__("sum", 2, SUITE_TEXTS["sum"][2])]
    with pytest.raises(SuiteError, match="--start"):
        load_prompts(data_dir, ["sum"], start=-1)


def test_bad_requests_get_clear_errors(data_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match="unknown suite.*nope.*choose from"):
        load_prompts(data_dir, ["sum", "nope"])
    with pytest.raises(SuiteError, match="gsm8k.jsonl"):
        load_prompts(data_dir, ["gsm8k"])
    with pytest.raises(SuiteError, match="--data"):
        load_prompts(None, ["sum"])
    with pytest.raises(ConfigError, match="unknown method.*speedy.*choose from"):
        BenchConfig(methods=("ar", "speedy"))
    with pytest.raises(ConfigError, match="hf assistant tokens"):
        BenchConfig(hf_assistant_tokens=("0",))
    with pytest.raises(ConfigError, match="sweep method"):
        SweepConfig(method="chain")
    with pytest.raises(ConfigError, match="budget"):
        SweepConfig(budgets=(0,))
    args = ["--data", str(data_dir), "--out", str(tmp_path)]
    assert main(args + ["--methods", "ar,speedy"]) == 2
    assert main(args + ["--suites", "nope"]) == 2


def test_missing_pypi_suite_is_skipped(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    prompts = load_prompts(data_dir, ["qa", "humaneval-pypi"])
    assert {p.suite for p in prompts} == {"qa"}
    with pytest.raises(SuiteError, match="no prompts"):
        load_prompts(data_dir, ["mt_bench-pypi"])


def test_methods_needing_a_draft_model_are_refused_without_one(bench_pair, data_dir: Path) -> None:
    target, _ = bench_pair
    prompts = load_prompts(data_dir, ["qa"])
    with pytest.raises(ConfigError, match="need.*draft model"):
        run_bench(Engine(target, None), prompts, BenchConfig(methods=("ar", "chain")))
    report = run_bench(Engine(target, None), prompts, BenchConfig(methods=("ar", "hf-pld"), max_new_tokens=6))
    assert {r.method for r in report.rows} == {"ar", "hf-pld"}


def test_speedup_is_a_ratio_of_tokens_per_second() -> None:
    """A near-tie can send a method down a shorter continuation: fewer tokens in less time is
    not a speedup. Speedup compares tokens per second; the best-of variant is the fastest."""
    from talon.bench.results import Sample, aggregate
    from talon.bench.runners import MethodSpec, Outcome
    from talon.specbench import Prompt

    class Fixed:
        def __init__(self, spec: MethodSpec) -> None:
            self.spec = spec

    ar = Fixed(MethodSpec("ar", "ar", "talon", {}))
    short = Fixed(MethodSpec("hf-pld[n=2]", "hf-pld", "hf", {"variant": "n=2"}, best_of=True))
    fast = Fixed(MethodSpec("hf-pld[n=3]", "hf-pld", "hf", {"variant": "n=3"}, best_of=True))
    prompt = Prompt("qa", 0, "q")
    samples = [
        Sample(prompt, ar.spec, Outcome(list(range(100)), 10.0, 100)),  # 10 tok/s
        Sample(prompt, short.spec, Outcome(list(range(40)), 5.0, 20)),  # 8 tok/s in half ar's time
        Sample(prompt, fast.spec, Outcome(list(range(100)), 8.0, 50)),  # 12.5 tok/s
    ]
    rows = {(r.suite, r.method): r for r in aggregate(samples, [], [ar, short, fast])}
    best = rows[("qa", "hf-pld")]
    assert best.settings["variant"] == "n=3"
    assert best.speedup_vs_ar == pytest.approx(1.25)
    assert best.settings["variants"] == {"n=2": 0.8, "n=3": 1.25}
    assert rows[("all", "ar")].speedup_vs_ar == pytest.approx(1.0)


def test_the_free_drafting_bound_matches_a_hand_computation() -> None:
    """bound = MAT x t_verify(1) / mean t_verify(tree tokens), per suite and over all suites, on a
    synthetic verify curve: 0.5 s for 1 token, 0.9 for 4, 1.4 for 8, 1.6 for 16 (linear between)."""
    from talon.bench.results import Sample, aggregate
    from talon.bench.runners import MethodSpec, Outcome
    from talon.specbench import Prompt

    class Fixed:
        def __init__(self, spec: MethodSpec) -> None:
            self.spec = spec

    verify = synthetic_costs({1: 0.5, 4: 0.9, 8: 1.4, 16: 1.6}).verify_s
    ar, talon = Fixed(MethodSpec("ar", "ar", "talon", {})), Fixed(MethodSpec("talon", "talon", "talon", {}))
    qa, summ = Prompt("qa", 0, "q"), Prompt("sum", 0, "s")
    samples = [
        Sample(qa, ar.spec, Outcome(list(range(9)), 4.5, 9, draft_sizes=[0] * 9)),  # 2 tok/s
        Sample(qa, talon.spec, Outcome(list(range(9)), 3.0, 3, draft_sizes=[3, 5, 0])),  # 3 tok/s
        Sample(summ, ar.spec, Outcome(list(range(8)), 4.0, 8, draft_sizes=[0] * 8)),
        Sample(summ, talon.spec, Outcome(list(range(8)), 2.0, 2, draft_sizes=[15, 3])),
    ]
    rows = {(r.suite, r.method): r for r in aggregate(samples, [], [ar, talon], verify)}
    # qa: trees of 4, 6 and 1 tokens verify in 0.9, 1.15 (between 0.9 and 1.4) and 0.5 s
    assert rows[("qa", "talon")].free_draft_bound == pytest.approx(9 * 0.5 / (0.9 + 1.15 + 0.5))
    assert rows[("qa", "talon")].bound_share == pytest.approx(1.5 / (9 * 0.5 / 2.55))
    assert rows[("sum", "talon")].free_draft_bound == pytest.approx(8 * 0.5 / (1.6 + 0.9))
    assert rows[("all", "talon")].free_draft_bound == pytest.approx(17 * 0.5 / (2.55 + 2.5))
    assert rows[("all", "ar")].free_draft_bound == pytest.approx(1.0)
    assert aggregate(samples, [], [ar, talon])[0].free_draft_bound is None  # no curve, no bound


def test_the_same_command_twice_gives_the_same_trees(bench_pair, data_dir: Path, tmp_path: Path) -> None:
    """Fixed cost model (the benchmark's default): every Talon run plans on the snapshot read at
    start (here a real probe, then the cache it wrote) and on predicted times only, so two runs
    of the same command draft the same trees, step by step, whatever the host's load."""
    target, draft = bench_pair
    prompts = load_prompts(data_dir, ["humaneval", "sum"], limit=2)
    cfg = BenchConfig(methods=("talon", "hybrid"), max_new_tokens=16, warmup_tokens=4)
    runs = [run_bench(Engine(target, draft, cost_cache=tmp_path), prompts, cfg) for _ in range(2)]
    trees = [
        {(s.prompt.suite, s.prompt.index, s.spec.name): (s.outcome.draft_sizes, s.outcome.accept_lens)
         for s in run.samples if s.spec.engine == "talon" and s.spec.name != "ar"}
        for run in runs
    ]
    assert trees[0] == trees[1]
    assert sum(n for sizes, _ in trees[0].values() for n in sizes) > 0, "the runs drafted nothing"
    sources = [next(iter(run.cost_models.values()))["source"] for run in runs]
    assert sources == ["probe", "cache"]
    mats = [[r.mat for r in run.rows if r.method == "talon"] for run in runs]
    assert mats[0] == mats[1]


def peer_row(config: str, suite: str, index: int, tokens: int, seconds: float, **kw) -> dict:
    row = {"engine": "llama.cpp", "config": config, "suite": suite, "index": index, "new_tokens": tokens,
           "seconds": seconds, "host": {"cpu": "AMD EPYC", "threads": 2, "llama.cpp": "version: 1 (x)"}}
    return row | kw


def test_peer_rows_merge_into_the_report_with_their_own_speedups(tmp_path) -> None:
    from talon.bench.peers import peer_cells, peer_section, read_peer_rows

    rows = [peer_row("plain", "gsm8k", 0, 90, 3.0), peer_row("plain", "humaneval", 0, 60, 3.0),
            peer_row("ngram-mod", "gsm8k", 0, 90, 2.0, draft_n=40, draft_n_accepted=30, equal_to_plain=True),
            peer_row("ngram-mod", "humaneval", 0, 60, 2.0, draft_n=20, draft_n_accepted=5, equal_to_plain=False)]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cells = {(c.config, c.suite): c for c in peer_cells(read_peer_rows(path))}
    assert cells[("plain", "all")].tokens_per_second == 150 / 6.0
    assert cells[("ngram-mod", "all")].acceptance == 35 / 60 and cells[("ngram-mod", "all")].equal_to_plain == 1
    talon = {"results": [{"suite": "all", "method": "ar", "tokens_per_second": 10.0},
                         {"suite": "all", "method": "talon", "tokens_per_second": 30.0}],
             "samples": [{"suite": "gsm8k", "prompt_index": 0}, {"suite": "humaneval", "prompt_index": 0}]}
    text = peer_section(read_peer_rows(path), talon)
    assert "| llama.cpp · ngram-mod | 45.0 | 30.0 | 37.5 | 1.50x | 58% of 60 | 1/2 |" in text
    assert "the same prompts as the table above" in text
    assert "**0.80x** llama.cpp's fastest configuration (`ngram-mod`, 37.5 tok/s)" in text
    assert "Talon 3.00x" in text and "llama.cpp 1.50x" in text
    talon["samples"].pop()
    assert "**not** the same prompts" in peer_section(read_peer_rows(path), talon)


@pytest.mark.parametrize("text, error", [("{not json", "not JSON"), ('{"engine": "x"}', "needs config"),
                                         ("", "no peer rows")])
def test_a_bad_peer_rows_file_is_refused_with_the_line(tmp_path, text: str, error: str) -> None:
    from talon.bench.peers import PeerRowsError, read_peer_rows

    path = tmp_path / "rows.jsonl"
    path.write_text(text)
    with pytest.raises(PeerRowsError, match=error):
        read_peer_rows(path)
    bad = peer_row("plain", "gsm8k", 0, 9, -1.0)
    path.write_text(json.dumps(bad))
    with pytest.raises(PeerRowsError, match="seconds must be a positive"):
        read_peer_rows(path)
