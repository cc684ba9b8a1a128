"""Cost-aware drafting: the cost model fits timings, the acceptance model calibrates, the builder
stops for cost under an expensive synthetic cost model (and not without it), a retrieval-first
step runs no draft forward, and the output stays the target's greedy output throughout."""

from __future__ import annotations

import itertools
import json
import random
import re
from pathlib import Path

import pytest
import torch

from talon.core.builder import build_tree
from talon.cost.cache import cache_path, read_cached
from talon.cost.curve import CURVE_SIZES, Curve, isotonic
from talon.cost.model import CostModel, synthetic_costs
from talon.cost.plan import (
    ENGAGE_MARGIN,
    EXPLORE_MODEL_STEPS,
    WATCH_STEPS,
    Beta,
    CalibratedAcceptance,
    Planner,
    drafting_without_catch_up,
)
from talon.cost.probe import MIN_REPS, SPREAD_OK, load_or_probe, probe_costs, spread_of
from talon.drafters.retrieval import Retriever
from talon.drafters.tree_drafter import SHORT_MATCH, TreeDrafter
from talon.engine.engine import Engine, generate
from talon.models import cpu_model
from talon.run_config import RetrievalConfig, RunConfig, TreeConfig
from talon.tree import DraftTree
from tests.tiny import noisy_copy, reference, synthetic, tiny_loaded


def linear_verify(n: float) -> float:
    return 0.13 + 0.005 * n  # a CPU-like verifier: 130 ms + 5 ms per node


def test_curve_fits_synthetic_timings() -> None:
    curve = Curve.fit({n: linear_verify(n) for n in (1, 4, 16, 64)})
    for n in (1, 3, 10, 24, 40, 64, 100):
        assert curve(n) == pytest.approx(linear_verify(n), rel=1e-9)
    flat = Curve.fit({1: 0.02, 64: 0.02})  # a GPU-like verifier: size is free
    assert flat(1) == flat(128) == pytest.approx(0.02)


def test_curve_is_monotone_and_refines_online() -> None:
    curve = Curve.fit({1: 0.3, 8: 0.2, 64: 0.25})  # a noisy probe: 8 looks cheaper than 1
    sizes = [curve(n) for n in range(1, 129)]
    assert all(a <= b for a, b in zip(sizes, sizes[1:]))
    truth = {g: 0.1 + 0.01 * g for g in CURVE_SIZES}
    curve = Curve.fit({1: 0.5, 128: 0.5})  # wrong start
    rng = random.Random(0)
    for _ in range(4000):
        n = rng.randint(1, 96)
        curve.observe(n, 0.1 + 0.01 * n)
    for n in (2, 12, 33, 80):
        assert curve(n) == pytest.approx(truth[2] if n == 2 else 0.1 + 0.01 * n, rel=0.05)


def test_a_noisy_probe_is_fitted_isotonically() -> None:
    """On this CPU a 1-token bf16 forward costs about what 4 do, and a probe sample can come out
    above its neighbours: pooling keeps the curve monotone without lifting every larger size to
    the outlier, as a running maximum does."""
    assert isotonic([0.25, 0.2, 0.24, 0.29]) == pytest.approx([0.225, 0.225, 0.24, 0.29])
    assert isotonic([0.1, 0.2, 0.3]) == [0.1, 0.2, 0.3]
    rng = random.Random(1)
    noisy = [0.2 + 0.01 * i + rng.uniform(-0.03, 0.03) for i in range(20)]
    fitted = isotonic(noisy)
    assert all(a <= b for a, b in zip(fitted, fitted[1:]))
    assert sum(fitted) == pytest.approx(sum(noisy))  # least squares keeps the mean
    samples = {1: 0.25, 2: 0.2, 4: 0.24, 8: 0.29}
    assert Curve.fit_monotone(samples)(1) == pytest.approx(0.225)
    assert Curve.fit(samples)(1) == pytest.approx(0.25) and Curve.fit(samples)(2) == pytest.approx(0.25)


def test_cost_model_round_trip_and_cache(tmp_path) -> None:
    costs = synthetic_costs({1: 0.1, 32: 0.2}, {1: 0.03, 16: 0.05}, other_s=0.01)
    again = CostModel.from_dict(costs.to_dict())
    assert again.verify_s(20) == pytest.approx(costs.verify_s(20))
    assert again.draft_s(7) == pytest.approx(costs.draft_s(7))
    target, draft = tiny_loaded("llama", 1), tiny_loaded("llama", 2)
    first = load_or_probe(target.model, draft.model, ("t", "d"), tmp_path, draft_vocab=64)
    second = load_or_probe(target.model, draft.model, ("t", "d"), tmp_path, draft_vocab=64)
    assert first.source == "probe" and second.source == "cache"
    assert second.verify(8) == first.verify(8) and second.draft(4) == first.draft(4)  # exact, from JSON
    made = first.provenance
    assert made.hardware == cpu_model() and made.torch == torch.__version__ and made.threads >= 1
    assert made.measured_at and 0 <= made.spread and made.noisy == (made.spread > SPREAD_OK)
    assert second.provenance.measured_at == made.measured_at and "cache, measured" in second.provenance.describe()
    for part in ("draft_vocab=64", f"hw={cpu_model()}", f"torch={torch.__version__}", "threads="):
        assert part in first.key
    assert len(list(tmp_path.iterdir())) == 1
    other_vocab = load_or_probe(target.model, draft.model, ("t", "d"), tmp_path, draft_vocab=32)
    assert other_vocab.source == "probe" and len(list(tmp_path.iterdir())) == 2  # another key, another file
    path = cache_path(tmp_path, first.key)
    old = json.loads(path.read_text())
    old["provenance"]["measured_at"] = "2020-01-01T00:00:00+00:00"  # older than MAX_AGE_DAYS
    path.write_text(json.dumps(old))
    assert read_cached(path, first.key) is None and read_cached(path, "another key") is None
    assert load_or_probe(target.model, draft.model, ("t", "d"), tmp_path, draft_vocab=64).source == "probe"


def test_the_planner_and_its_cost_model_import_no_torch() -> None:
    """The planner and its cost model are plain Python: the probe and the cache are apart, and
    the tree's tensors (its mask, its positions) are built where the target verifies."""
    import subprocess
    import sys

    code = ("import sys, talon.cost.plan, talon.cost.model, talon.cost.curve, talon.knobs; "
            "print('torch' in sys.modules or 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "False"


def test_the_probe_repeats_until_the_best_timings_agree() -> None:
    assert spread_of([0.10, 0.30, 0.102]) == pytest.approx(0.02)
    assert spread_of([0.1]) == float("inf")
    model = tiny_loaded("llama", 1).model
    quick = probe_costs(model, None, max_reps=MIN_REPS)
    assert quick.provenance.source == "probe" and quick.draft is None
    assert quick.provenance.noisy == (quick.provenance.spread > SPREAD_OK)


def test_the_probes_prefix_is_shaped_as_a_real_prefill() -> None:
    """The probe attends over random keys and values: every layer holds what a real prefill of
    the prefix would, in shape, dtype and device, and a forward over it appends as over a real one."""
    from transformers import DynamicCache

    from talon.core.forward import forward_hidden
    from talon.cost.probe import random_prefix

    model = tiny_loaded("qwen2", 1).model
    ids = torch.arange(40) % model.config.vocab_size
    real = DynamicCache(config=model.config)
    forward_hidden(model, real, ids[:32], torch.arange(32), None)
    probe = random_prefix(model, 32, ids)
    assert probe.get_seq_length() == real.get_seq_length() == 32
    for ours, theirs in zip(probe.layers, real.layers, strict=True):
        for a, b in ((ours.keys, theirs.keys), (ours.values, theirs.values)):
            assert (a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device)
    forward_hidden(model, probe, ids[32:40], torch.arange(32, 40), None)
    assert probe.get_seq_length() == 40


def test_a_size_whose_timings_agree_is_not_timed_again() -> None:
    """Only the sizes whose two best timings still disagree are repeated, up to the last round."""
    from talon.cost.probe import MAX_REPS, _probe_curve

    calls: list[int] = []
    drifting = iter([1.0 + 0.2 * i for i in range(MAX_REPS + 1)])  # best two always 20% apart

    def timer(model: object, prefix: int, vocab: int, max_size: int):  # noqa: ANN202 - a Timer
        def time_once(size: int) -> float:
            calls.append(size)
            return next(drifting) if size == 1 else 2.0
        return time_once

    probed = _probe_curve(None, [1, 8], 256, 0, timer=timer)  # type: ignore[arg-type]
    assert calls.count(8) == MIN_REPS and calls.count(1) == 1 + MAX_REPS  # the warm-up, then every round
    assert probed.best == {1: 1.2, 8: 2.0} and probed.spread == pytest.approx(0.2 / 1.2) and probed.noisy


def test_acceptance_model_calibrates_from_history() -> None:
    model = CalibratedAcceptance()
    tree = DraftTree.with_root(0)
    a = tree.add(0, 1, 0.95, "model")
    b = tree.add(0, 2, 0.95, "model")
    before = model.p_cond("model", 0.95, 0)
    for _ in range(50):  # confident model nodes that are rejected half the time
        model.observe(tree, [0, a], match_len=0)
    after = model.p_cond("model", 0.95, 0)
    assert after == pytest.approx(0.5, abs=0.05) and after < before
    probs = model.node_probs(tree, 0)
    assert probs[0] == 1.0 and probs[a] == probs[b]
    assert sum(probs[1:]) == pytest.approx(2 * model.p_cond("model", 0.95, 0))


CFG = TreeConfig(mode="adaptive", budget=32, root_k=4, top_k=2, mu=0.05, max_depth=8, min_conf=0.0)


def test_builder_stops_for_cost_only_under_an_expensive_cost_model() -> None:
    free = synthetic_costs({1: 0.1, 128: 0.1}, {1: 0.0, 128: 0.0})
    pricey = synthetic_costs({1: 0.1, 128: 0.1 + 127 * 0.05}, {1: 0.5, 128: 0.5})
    plain = build_tree(DraftTree.with_root(3), synthetic(0.9), CFG, CFG.budget)
    cheap = build_tree(DraftTree.with_root(3), synthetic(0.9), CFG, CFG.budget, Planner(free, CFG, 64))
    costly = build_tree(DraftTree.with_root(3), synthetic(0.9), CFG, CFG.budget, Planner(pricey, CFG, 64))
    assert plain.stop in ("budget", "depth") and cheap.stop in ("budget", "depth")
    assert costly.stop == "cost"
    assert max(costly.depths) < max(plain.depths) and costly.num_draft < plain.num_draft


def test_cost_stop_looks_past_a_costly_first_layer() -> None:
    """Float32 on a CPU: verifying 2 tokens costs twice 1, but 8 barely more than 2. One layer
    alone does not pay; the path it opens does, so the layer is drafted when depth allows."""
    jump = synthetic_costs({1: 0.4, 2: 0.8, 8: 0.82, 128: 1.5}, {1: 0.01, 128: 0.01})
    root = DraftTree.with_root(3)
    deep = Planner(jump, TreeConfig(mode="chain", max_depth=6, min_conf=0.0), 64)
    shallow = Planner(jump, TreeConfig(mode="chain", max_depth=1, min_conf=0.0), 64)
    for planner in (deep, shallow):
        planner.acceptance.continues = Beta.prior(0.6)
        planner.drafted_s = lambda: 0.0  # type: ignore[method-assign]
    assert deep.worth_layer(root, [0], 1, 24, 0)
    assert not shallow.worth_layer(root, [0], 1, 24, 0)


def random_expand(seed: int):
    """A drafter whose children have random, decreasing probabilities (no ties)."""
    rng = random.Random(seed)

    def expand(tree: DraftTree, nodes: list[int], k: int):
        out = []
        for n in nodes:
            qs = sorted((rng.uniform(0.02, 0.9) for _ in range(k)), reverse=True)
            out.append([((tree.tokens[n] * 7 + 1 + i) % 50, q / max(1.0, sum(qs))) for i, q in enumerate(qs)])
        return out

    return expand


def best_subtree_rate(planner: Planner, tree: DraftTree) -> float:
    """Brute force: the best (expected accepted + 1) / step time over every subtree that keeps
    each kept node's parent (the root always kept)."""
    probs = planner.acceptance.node_probs(tree, 0)
    best = 0.0
    nodes = range(1, len(tree))
    for keep in itertools.product((False, True), repeat=len(tree) - 1):
        kept = {n for n, k in zip(nodes, keep) if k}
        if all(tree.parents[n] == 0 or tree.parents[n] in kept for n in kept):
            best = max(best, (sum(probs[n] for n in kept) + 1.0) / planner.step_time(len(kept)))
    return best


def trim_rate(planner: Planner, tree: DraftTree) -> float:
    trimmed, _ = planner.trim(tree, 0)
    return (sum(planner.acceptance.node_probs(trimmed, 0)[1:]) + 1.0) / planner.step_time(trimmed.num_draft)


@pytest.mark.parametrize("seed", range(6))
def test_trim_is_goodput_optimal(seed: int) -> None:
    """On small trees under a synthetic cost model, the trimmed tree reaches the best goodput of
    any ancestor-closed subtree (checked by brute force over every subtree)."""
    cfg = TreeConfig(mode="adaptive", budget=11, root_k=3, top_k=2, mu=0.05, max_depth=4, min_conf=0.0)
    tree = build_tree(DraftTree.with_root(3), random_expand(seed), cfg, cfg.budget)
    assert 5 <= tree.num_draft <= 11
    rng = random.Random(seed)
    verify = {1: 0.1, 2: 0.1 + rng.uniform(0, 0.05), 8: 0.2 + rng.uniform(0, 0.2), 16: 0.5}
    planner = Planner(synthetic_costs(verify), cfg, 64)
    planner.drafted_s = lambda: 0.0  # type: ignore[method-assign]
    trimmed, cut = planner.trim(tree, 0)
    assert cut > 0, "under a steep cost model something must go"
    assert trim_rate(planner, tree) == pytest.approx(best_subtree_rate(planner, tree), rel=1e-9)
    assert set(trimmed.tokens) <= set(tree.tokens) and all(trimmed.parents[i] < i for i in range(1, len(trimmed)))
    flat = Planner(synthetic_costs({1: 0.1, 128: 0.1}), cfg, 64)
    assert flat.trim(tree, 0)[1] == 0  # free verification: keep everything


@pytest.fixture(scope="module")
def cost_pair():
    target = tiny_loaded("llama", 11)
    return target, noisy_copy(target, 12, 0.3)


def test_retrieval_first_runs_no_draft_forward_and_stays_lossless(cost_pair) -> None:
    """With a draft model that costs a second per forward, a hybrid run on a repetitive prompt
    drafts from retrieval alone: the draft model is never engaged (not even its prefill)."""
    target, draft = cost_pair
    slow_draft = synthetic_costs({1: 0.01, 128: 0.02}, {1: 1.0, 128: 1.0}, prefill_per_token_s=0.05)
    engine = Engine(target, draft, costs=slow_draft)
    prompt = "abc abc abc abc abc abc abc abc abc abc abc"
    summary, steps = generate(engine, prompt, RunConfig(drafter="hybrid", max_new_tokens=32))
    assert summary.token_ids == reference(engine, summary.prompt_token_ids, 32)
    assert summary.draft_forwards == 0 and all(s.draft_forwards == 0 for s in steps)
    assert all(s.model_skipped and s.tree_stop == "skipped" for s in steps)
    assert any(s.sources.count("retrieval") > 0 for s in steps)
    assert summary.model_skips == len(steps)
    cheap = Engine(target, draft, costs=synthetic_costs({1: 0.01, 128: 0.01}, {1: 0.0001, 128: 0.0001}))
    summary, steps = generate(cheap, "The quick brown fox", RunConfig(drafter="hybrid", max_new_tokens=32))
    assert summary.token_ids == reference(cheap, summary.prompt_token_ids, 32)
    assert summary.draft_forwards > 0 and sum(s.draft_forwards for s in steps) == summary.draft_forwards


@pytest.mark.parametrize("mode", ["adaptive", "static", "chain"])
@pytest.mark.parametrize("drafter", ["hybrid", "model", "retrieval"])
def test_cost_aware_greedy_is_lossless(cost_pair, mode: str, drafter: str) -> None:
    target, draft = cost_pair
    engine = Engine(target, draft, costs=synthetic_costs({1: 0.1, 64: 0.2}, {1: 0.02, 64: 0.03}))
    cfg = RunConfig(drafter=drafter, tree=TreeConfig(mode=mode, budget=12, cost_aware=True), max_new_tokens=32)
    drafted = 0
    for prompt in ("def add(a, b):", "hello hello hello hello"):
        summary, steps = generate(engine, prompt, cfg)
        assert summary.token_ids == reference(engine, summary.prompt_token_ids, 32)
        assert all(len(s.tokens) - 1 <= 12 for s in steps)
        assert all(s.tree_stop for s in steps) and summary.cost_model["format"] == "talon-cost/1"
        drafted += sum(len(s.tokens) - 1 for s in steps)
    assert drafted > 0, "drafting pays under this cost model: the planner must not collapse to plain decoding"


def test_engaged_model_is_explored_before_the_planner_may_skip_it(cost_pair) -> None:
    """A prior is not evidence: even when the cost model says the draft model cannot pay, it runs
    on the first steps so that the acceptance it actually reaches is measured."""
    target, draft = cost_pair
    engine = Engine(target, draft, costs=synthetic_costs({1: 0.01, 128: 0.02}, {1: 1.0, 128: 1.0}))
    summary, steps = generate(engine, "def add(a, b):", RunConfig(drafter="model", max_new_tokens=24))
    assert summary.token_ids == reference(engine, summary.prompt_token_ids, 24)
    assert all(s.draft_forwards > 0 and not s.model_skipped for s in steps[:EXPLORE_MODEL_STEPS])


def test_the_model_outlook_leaves_the_catch_up_to_the_decision() -> None:
    """A model step after a skip streak feeds the skipped tokens with its root forward: the
    outlook charges that forward at width 1, or the catch-up would count twice against the model."""
    costs = synthetic_costs({1: 0.2, 128: 0.4}, {1: 0.04, 128: 0.2})
    assert drafting_without_catch_up([(1, 0.05), (4, 0.06)], costs) == pytest.approx(0.11)
    assert drafting_without_catch_up([(9, 0.30), (4, 0.06)], costs) == pytest.approx(0.04 + 0.06)
    assert drafting_without_catch_up([], costs) == 0.0


def test_a_long_prefill_waits_for_evidence_from_retrieval() -> None:
    """A draft model whose prompt prefill costs several target steps (a long document) is not
    engaged on the prior alone: retrieval runs WATCH_STEPS steps first, then the measured goodput
    without the model decides. A short prompt's prefill is paid at once."""
    costs = synthetic_costs({1: 0.2, 128: 0.6}, {1: 0.04, 128: 0.2}, prefill_per_token_s=0.003)
    root = DraftTree.with_root(1)
    planner = Planner(costs, TreeConfig(), 512)
    assert planner.model_decision(root, 0, pending=40, engaged=False) == ""
    for i in range(WATCH_STEPS):
        assert "waits until retrieval alone has run" in planner.model_decision(root, 0, pending=800, engaged=False)
        planner.record_step(root, [0], 1, model_ran=False, model_draft_s=0.0, step_s=0.2)
    assert planner.model_decision(root, 0, pending=800, engaged=False) == ""  # retrieval alone: 5 tok/s
    fast = Planner(costs, TreeConfig(), 512)
    for i in range(WATCH_STEPS):
        fast.record_step(root, [0], 8, model_ran=False, model_draft_s=0.0, step_s=0.25)  # 32 tok/s
    assert "would not pay back" in fast.model_decision(root, 0, pending=800, engaged=False)


def test_runs_plan_on_their_own_copy_and_fixed_runs_never_read_the_clock(cost_pair, monkeypatch) -> None:
    target, draft = cost_pair
    engine = Engine(target, draft, costs=synthetic_costs({1: 0.1, 64: 0.2}, {1: 0.02, 64: 0.03}))
    snapshot = engine.cost_snapshot(RunConfig().draft_vocab).to_dict()
    learn = RunConfig(drafter="hybrid", max_new_tokens=24, cost_model="learn")
    summary, _ = generate(engine, "def add(a, b):", learn)
    assert summary.cost_model["mode"] == "learn" and summary.cost_model["observations"] > 0
    assert engine.cost_snapshot(learn.draft_vocab).to_dict() == snapshot, "a run must not change the engine's curves"

    def trees(cfg: RunConfig) -> list[tuple[list[int], list[int]]]:
        _, steps = generate(engine, "def add(a, b):", cfg)
        return [(s.tokens, s.accepted) for s in steps]

    fixed = learn.replace(cost_model="fixed")
    quiet = trees(fixed)
    assert any(len(tokens) > 1 for tokens, _ in quiet)
    rng = random.Random(0)
    clock = iter(itertools.accumulate(rng.uniform(0.0, 5.0) for _ in range(100_000)))
    monkeypatch.setattr("talon.cost.plan.time.perf_counter", lambda: next(clock))  # a wildly busy host
    assert trees(fixed) == quiet
    engine.adopt_costs(CostModel.from_dict({**snapshot, "verify_s": [10 * v for v in snapshot["verify_s"]]}),
                       learn.draft_vocab)
    assert engine.cost_snapshot(learn.draft_vocab).verify_s(1) == pytest.approx(10 * 0.1)


def test_the_suite_keeps_away_from_the_users_cost_cache() -> None:
    """conftest points TALON_COST_CACHE at a temporary folder for the whole session (apps the
    suite starts inherit it): curves measured under test load never reach a user's app."""
    from talon.settings import Settings

    folder = Settings.from_env().cost_cache_dir
    assert folder.name.startswith("talon-test-costs-") and folder != Path.home() / ".cache/talon/costs"


# --- retrieval at full strength, and guesses that must pay -----------------------------------

INTEL_F32 = {1: 0.518, 4: 0.954, 8: 1.386, 16: 1.566, 32: 1.942}  # target forwards measured on a Xeon (s)


def skipped_steps_send_the_full_proposal(steps, prompt_ids: list[int], cfg: RunConfig) -> int:
    """Replay the context through an independent retriever: on every step the draft model
    skipped, the verified tree is exactly its proposal at the full budget. Returns those steps."""
    shadow = Retriever(cfg.retrieval)
    shadow.reset(prompt_ids)
    skipped = 0
    for step in steps:
        if step.model_skipped:
            assert step.draft_forwards == 0
            proposal = shadow.propose(cfg.tree.budget, SHORT_MATCH)
            assert step.tokens[1:] == proposal.tokens
            assert step.parents[1:] == [p + 1 for p in proposal.parents]
            skipped += 1
        shadow.extend(step.new_tokens)
    return skipped


def test_a_retrieval_first_step_verifies_the_full_budget_proposal(cost_pair) -> None:
    """When the draft model does not run, retrieval sends what it proposes at the full budget
    (not its share of a shared tree): every such tree is exactly the proposal an independent
    retriever makes over the same context, and a long chain fills the budget. Both ways
    the model sits out: not engaged (its drafting too dear), and engaged but skipped for a step
    because retrieval alone is expected to do better (retrieval first)."""
    target, draft = cost_pair
    cfg = RunConfig(drafter="hybrid", max_new_tokens=32, cost_model="fixed")  # verification stays free
    prompt = "abcdefghijklmnopqrstuvwxyz " * 6
    dear = synthetic_costs({1: 0.01, 128: 0.01}, {1: 1.0, 128: 1.0}, prefill_per_token_s=0.05)
    cheap = synthetic_costs({1: 0.01, 128: 0.01}, {1: 0.002, 128: 0.003}, prefill_per_token_s=0.00001)
    runs = {}
    for name, costs in (("dear", dear), ("cheap", cheap)):
        engine = Engine(target, draft, costs=costs)
        summary, steps = generate(engine, prompt, cfg)
        assert summary.token_ids == reference(engine, summary.prompt_token_ids, 32)
        assert skipped_steps_send_the_full_proposal(steps, summary.prompt_token_ids, cfg) > 0
        budget = cfg.tree.budget
        assert len(steps[0].tokens) - 1 == budget > round(0.75 * budget)  # more than any shared graft
        runs[name] = steps
    assert all(s.model_skipped for s in runs["dear"])
    assert any(s.draft_forwards for s in runs["cheap"])
    assert any(s.model_skipped.startswith("retrieval first") for s in runs["cheap"])


def test_the_share_of_a_shared_tree_is_the_head_of_the_full_proposal() -> None:
    """One proposal per step serves both: the share grafted under the model's tree is what a
    proposal capped at that share would have been."""
    drafter = Retriever(RetrievalConfig(max_continuation=6, max_branches=3))
    drafter.reset([1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 1, 2, 3, 4, 8, 1, 2, 3])
    full = drafter.propose(16)
    assert len(full) > 6
    for cap in range(len(full) + 1):
        capped = drafter.propose(cap)
        head = full.head(cap)
        assert (head.tokens, head.parents, head.q) == (capped.tokens, capped.parents, capped.q)


def failing_guesses(verify: dict[int, float], steps: int, seed: int = 0) -> list[int]:
    """Run a retrieval-only drafter under a planner on a random stream over 4 letters (suffix
    matches of every length, 1 to several tokens, at every step) whose next token is never one
    the tree guessed: every guess fails. Returns the draft nodes sent per step."""
    rng = random.Random(seed)
    letters = [10, 11, 12, 13]
    cfg = TreeConfig()
    drafter = TreeDrafter(cfg, None, Retriever(RetrievalConfig()), RetrievalConfig())
    context = [rng.choice(letters) for _ in range(300)]
    drafter.reset(context)
    planner = Planner(synthetic_costs(verify), cfg, steps, predicted=True, acceptance=drafter.acceptance)
    sent = []
    for _ in range(steps):
        planner.begin_step()
        draft = drafter.draft(context[-1], planner)
        guessed = {draft.tree.tokens[c] for c in draft.tree.children(0)}
        token = rng.choice([t for t in letters if t not in guessed])
        drafter.commit(draft.tree, [0], [token], draft.match_len)
        planner.record_step(draft.tree, [0], 1, model_ran=False, model_draft_s=0.0, step_s=0.5)
        context.append(token)
        sent.append(draft.tree.num_draft)
    return sent


def test_failing_guesses_stop_being_sent_where_they_cost_verification() -> None:
    """Verification of 2 tokens costs 28 % more than of 1 (the Xeon's float32 curve): guesses that
    keep failing stop within a few steps, whatever match length the next one comes with (the
    acceptance model pools the evidence), so retrieval costs nothing against plain decoding."""
    sent = failing_guesses(INTEL_F32, 60)
    assert sent[0] > 0, "a long match's first guess is worth sending on the prior"
    assert sum(1 for n in sent if n) <= 6
    assert not any(sent[10:])


def test_cheap_guesses_ride_free_where_extra_nodes_cost_nothing() -> None:
    """Where a 1-token forward costs what a 4-token one does (the isotonic fit of the AMD host),
    a guess costs nothing: even after many failures a few nodes still go with every step."""
    sent = failing_guesses({1: 0.2, 4: 0.2, 8: 0.3, 16: 0.45, 32: 0.8}, 60)
    assert all(1 <= n <= 3 for n in sent[20:])


def test_pooled_evidence_only_makes_other_bins_more_cautious() -> None:
    """Failures in one match-length bin lower the others at once; successes raise only their own
    bin: a bin never tried keeps its prior, so a lucky streak of short guesses cannot send a long
    chain on borrowed optimism."""
    model = CalibratedAcceptance()
    tree = DraftTree.with_root(0)
    node = tree.add(0, 5, 1.0, "retrieval")
    untried = model.p_cond("retrieval", 1.0, 20)
    for _ in range(10):
        model.observe(tree, [0, node], match_len=1)  # one-token matches, always accepted
    assert model.p_cond("retrieval", 1.0, 1) > 0.7
    assert model.p_cond("retrieval", 1.0, 20) == pytest.approx(untried)
    failing = CalibratedAcceptance()
    for _ in range(5):
        failing.observe(tree, [0], match_len=3)  # three-token matches, always rejected
    assert failing.p_cond("retrieval", 1.0, 20) < 0.5 * untried


def test_a_retrieval_chain_earns_trust_as_it_goes() -> None:
    """Once its parent is accepted, a retrieval node continues a match one token longer: a node at
    depth d is judged as a (match_len + d - 1)-token match, so the conditional acceptance rises
    along a copied passage instead of staying at the first node's, and hits deep in a chain teach
    the long-match bins, not the short one."""
    model = CalibratedAcceptance()
    tree = DraftTree.with_root(0)
    parent = 0
    for token in range(1, 9):
        parent = tree.add(parent, token, 1.0, "retrieval")
    probs = model.node_probs(tree, match_len=2)
    conditional = [probs[n] / probs[tree.parents[n]] for n in range(1, len(tree))]
    assert conditional == pytest.approx([model.p_cond("retrieval", 1.0, 2 + d) for d in range(8)])
    assert conditional[-1] > conditional[0] + 0.2
    assert all(b >= a for a, b in zip(conditional, conditional[1:]))
    learnt = CalibratedAcceptance()
    for _ in range(6):
        learnt.observe(tree, list(range(len(tree))), match_len=2)  # the whole passage accepted
    assert learnt.p_cond("retrieval", 1.0, 9) > model.p_cond("retrieval", 1.0, 9) + 0.05
    assert learnt.p_cond("retrieval", 1.0, 9, depth=1) == pytest.approx(learnt.p_cond("retrieval", 1.0, 2, depth=8))


def test_the_draft_models_prefill_needs_a_margin_over_its_prior() -> None:
    """Before the draft model has run, the saving it promises is the outlook's prior: its prompt
    prefill is paid only when that saving exceeds the prefill ENGAGE_MARGIN times over, so a
    saving between one and ENGAGE_MARGIN prefills keeps retrieval alone (sum's articles)."""
    costs = synthetic_costs({1: 0.2, 128: 0.6}, {1: 0.04, 128: 0.2}, prefill_per_token_s=0.003)
    root = DraftTree.with_root(1)
    held_back, engaged = [], 0
    for tokens in range(1, 40):
        planner = Planner(costs, TreeConfig(), 128)
        for _ in range(WATCH_STEPS):
            planner.record_step(root, [0], tokens, model_ran=False, model_draft_s=0.0, step_s=1.0)
        why = planner.model_decision(root, 0, pending=800, engaged=False)
        if not why:
            engaged += 1
            continue
        saved, prefill = (float(x) for x in re.findall(r"\(([-\d.]+) s(?: saved)?\)", why)[::-1][:2])
        held_back.append(saved / prefill)
    assert ENGAGE_MARGIN > 1 and engaged > 0
    assert any(1.0 < ratio <= ENGAGE_MARGIN for ratio in held_back), held_back


def test_the_probe_times_the_engines_own_step_and_keys_it() -> None:
    """A static-step engine probes its curves on the static forward (talon.graphs.pool.StaticTimer),
    caches them under a key naming the step, and gives the probe's forwards back."""
    from talon.cost.probe import cost_key

    target = tiny_loaded("llama", 21)
    draft = noisy_copy(target, 22, 0.3)
    engine = Engine(target, draft, forward="static")
    costs = engine.cost_snapshot()
    assert costs.verify_s(16) > 0 and costs.draft_s(4) > 0 and costs.prefill_per_token_s > 0
    assert (costs.key.endswith("|forward=static+fold")
            and "forward=" not in cost_key(target.model, draft.model, ("t", "d")))
    assert len(engine.static_pools["target"].free) == engine.static_pools["target"].made == 1
    assert len(engine.static_pools["draft"].free) == engine.static_pools["draft"].made == 1
    assert Engine(target, draft).forward == "dynamic", "auto is the dynamic cache off CUDA"



def test_the_cache_keeps_only_what_it_can_trust(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe taken on a busy host plans its run but is never cached nor read back; a cached
    curve that a run's measured steps contradict is retired, so the next start probes again."""
    import dataclasses
    import datetime

    import talon.cost.cache as cache
    import talon.cost.probe as probing

    target = tiny_loaded("llama", 1)
    spreads = iter([2.2, 0.1, 0.1, 2.2])

    def probe(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - probe_costs' signature
        costs = synthetic_costs({1: 0.3, 16: 0.5}, {1: 0.1})
        now = datetime.datetime.now(datetime.timezone.utc).isoformat()
        costs.provenance = dataclasses.replace(costs.provenance, spread=next(spreads), measured_at=now)
        return costs

    monkeypatch.setattr(probing, "probe_costs", probe)
    busy = load_or_probe(target.model, None, ("t", "none"), tmp_path)
    path = cache_path(tmp_path, busy.key)
    assert busy.provenance.spread == 2.2 and not path.exists(), "a busy probe is used, never cached"
    quiet = load_or_probe(target.model, None, ("t", "none"), tmp_path)
    assert path.exists() and read_cached(path, quiet.key) is not None
    data = json.loads(path.read_text())
    data["provenance"]["spread"] = 2.2
    path.write_text(json.dumps(data))
    assert read_cached(path, quiet.key) is None, "a busy entry is never read"
    load_or_probe(target.model, None, ("t", "none"), tmp_path)  # probed again, quietly, and cached
    cached = read_cached(path, quiet.key)
    assert cached is not None
    assert not cache.retire_if_contradicted(tmp_path, cached, synthetic_costs({1: 0.33, 16: 0.55}, {1: 0.11}))
    assert path.exists(), "steps that agree within 1.5x keep the curve"
    assert cache.retire_if_contradicted(tmp_path, cached, synthetic_costs({1: 0.9, 16: 1.5}, {1: 0.1}))
    assert not path.exists(), "a curve the steps contradict is retired"
    tiny = synthetic_costs({1: 1e-4, 16: 2e-4})
    tiny.provenance = dataclasses.replace(tiny.provenance, spread=2.2)
    assert not cache.busy(tiny), "a tiny model's microseconds jitter whatever the host"


def test_an_engine_retires_the_cached_curve_a_learned_run_contradicts(tmp_path: Path) -> None:
    target = tiny_loaded("llama", 1)
    engine = Engine(target, noisy_copy(target, 2, 0.1), cost_cache=tmp_path)
    snapshot = engine.cost_snapshot(64)
    path = cache_path(tmp_path, snapshot.key)
    assert path.exists(), "a tiny model's probe is never too busy to cache"
    engine.adopt_costs(snapshot.copy(), 64)
    assert path.exists(), "the same curves do not contradict themselves"
    slower = synthetic_costs({n: 3 * snapshot.verify_s(n) for n in (1, 16, 64)}, {1: snapshot.draft_s(1)})
    engine.adopt_costs(slower, 64)
    assert not path.exists() and engine.cost_snapshot(64).verify_s(1) == slower.verify_s(1)
