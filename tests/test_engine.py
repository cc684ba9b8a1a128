"""Engine invariants on tiny random models (float32): tree logits equal sequential logits, the
cache after commit equals a plain forward, and greedy speculative output equals generate()."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import DynamicCache

from talon.core.forward import forward_hidden, tree_mask, tree_positions
from talon.core.kv import keep_dynamic
from talon.core.verify import verify_tree
from talon.cost.model import synthetic_costs
from talon.engine.engine import Engine, generate
from talon.models import LoadedModel
from talon.run_config import RunConfig, SamplingConfig, TreeConfig
from tests.tiny import (
    PROMPTS,
    VOCAB,
    OracleTreeDrafter,
    byte_tokenizer,
    noisy_copy,
    random_tree,
    reference,
    tiny_loaded,
    tiny_model,
)


def prefill(model, ids: list[int]) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    forward_hidden(model, cache, torch.tensor(ids), torch.arange(len(ids)), None)
    return cache


def sequential_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0, -1].float()


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_logits_equal_sequential_logits(kind: str, seed: int) -> None:
    rng = random.Random(seed)
    model = tiny_model(kind, seed)
    prefix = [rng.randrange(VOCAB - 2) for _ in range(9)]
    tree = random_tree(rng, 14)
    cache = prefill(model, prefix)
    logits = verify_tree(model, cache, tree.tokens, tree_mask(tree), tree_positions(tree, len(prefix)))
    assert logits.shape == (len(tree), VOCAB)
    for node in range(len(tree)):
        path_tokens = [tree.tokens[n] for n in tree.path(node)]
        expected = sequential_logits(model, prefix + path_tokens)
        torch.testing.assert_close(logits[node], expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_cache_after_commit_equals_plain_forward(kind: str) -> None:
    rng = random.Random(7)
    model = tiny_model(kind, 3)
    prefix = [rng.randrange(VOCAB - 2) for _ in range(6)]
    tree = random_tree(rng, 12)
    leaf = max(range(len(tree)), key=lambda n: tree.depths[n])
    accepted = tree.path(leaf)
    cache = prefill(model, prefix)
    verify_tree(model, cache, tree.tokens, tree_mask(tree), tree_positions(tree, len(prefix)))
    keep_dynamic(cache, len(prefix), [len(prefix) + n for n in accepted])
    plain = prefill(model, prefix + [tree.tokens[n] for n in accepted])
    for got, want in zip(cache.layers, plain.layers):
        torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=1e-5)






@pytest.fixture(scope="module")
def engine_pair():
    target = tiny_loaded("llama", 11)
    return target, noisy_copy(target, 12, 0.3)


@pytest.mark.parametrize("cost_aware", [False, True])
@pytest.mark.parametrize("mode", ["chain", "static", "adaptive"])
@pytest.mark.parametrize("budget", [1, 4, 12])
def test_model_drafter_greedy_is_lossless(engine_pair, mode: str, budget: int, cost_aware: bool) -> None:
    target, draft = engine_pair
    # Cost-aware: a GPU-like synthetic cost model (verification nearly flat, drafting cheap) under
    # which drafting pays, so the planner must draft; not the tiny models' own probe, under which
    # a draft as big as the target rightly never pays and the run collapses to plain decoding.
    costs = synthetic_costs({1: 0.1, 64: 0.11}, {1: 0.001, 64: 0.002}) if cost_aware else None
    engine = Engine(target, draft, costs=costs)
    tree = TreeConfig(mode=mode, budget=budget, root_k=3, top_k=2, mu=0.05, max_depth=6, cost_aware=cost_aware)
    cfg = RunConfig(drafter="model", tree=tree, max_new_tokens=40)
    mats = []
    for prompt in PROMPTS:
        summary, steps = generate(engine, prompt, cfg)
        assert summary.token_ids == reference(engine, summary.prompt_token_ids, 40), (prompt, mode)
        assert all(s.accepted[0] == 0 for s in steps)
        assert all(s.accept_len + 1 == len(s.new_tokens) or s is steps[-1] for s in steps)
        assert all(len(s.tokens) - 1 <= budget for s in steps)
        assert not cost_aware or sum(s.draft_forwards for s in steps) > 0, "the planner must draft"
        mats.append(summary.mean_accepted_tokens)
    if budget > 1:
        assert max(mats) > 1.2, "a close draft model must get drafts accepted"


@pytest.mark.parametrize("mode", ["static", "adaptive"])
def test_both_admissions_are_lossless_and_rank_differently(engine_pair, mode: str) -> None:
    """Ranked by calibrated acceptance (the default) or by raw path confidence, the output is the
    target's; the run's own acceptance model changes which nodes take the budget."""
    target, draft = engine_pair
    engine = Engine(target, draft)
    trees = {}
    for admission in ("calibrated", "confidence"):
        tree = TreeConfig(mode=mode, budget=8, root_k=3, top_k=2, mu=0.05, max_depth=6, min_conf=0.0,
                          cost_aware=False, admission=admission)
        cfg = RunConfig(drafter="model", tree=tree, max_new_tokens=40)
        trees[admission] = []
        for prompt in PROMPTS:
            summary, steps = generate(engine, prompt, cfg)
            assert summary.token_ids == reference(engine, summary.prompt_token_ids, 40), (prompt, admission)
            assert all(len(s.tokens) - 1 <= 8 for s in steps)
            trees[admission].append([(s.tokens, s.parents) for s in steps])
    assert trees["calibrated"] != trees["confidence"]


def test_autoregressive_baseline_is_lossless(engine_pair) -> None:
    target, _ = engine_pair
    engine = Engine(target, None)
    cfg = RunConfig(drafter="none", max_new_tokens=30)
    for prompt in PROMPTS:
        summary, steps = generate(engine, prompt, cfg)
        assert summary.token_ids == reference(engine, summary.prompt_token_ids, 30)
        assert summary.mean_accepted_tokens == 1.0 and all(len(s.tokens) == 1 for s in steps)




@pytest.mark.parametrize("seed", range(8))
def test_random_trees_through_the_verifier_are_lossless(engine_pair, seed: int) -> None:
    target, _ = engine_pair
    engine = Engine(target, None)
    prompt = PROMPTS[seed % len(PROMPTS)]
    cfg = RunConfig(drafter="none", max_new_tokens=48)
    ids = engine.run(prompt, cfg).prompt_ids
    want = reference(engine, ids, 48)
    run = engine.run(prompt, cfg)
    run.drafter = OracleTreeDrafter(want, seed, size=10 + seed)
    for _ in run:
        pass
    assert run.summary.token_ids == want
    assert run.summary.mean_accepted_tokens > 1.0


def test_bad_input_is_refused_clearly(engine_pair) -> None:
    from talon.engine.prompt import PromptError
    from talon.run_config import ConfigError

    target, draft = engine_pair
    engine = Engine(target, draft)
    with pytest.raises(PromptError, match="empty"):
        engine.run("   ", RunConfig())
    with pytest.raises(ConfigError, match="max_new_tokens"):
        RunConfig(max_new_tokens=0)
    with pytest.raises(ConfigError, match="needs a draft model"):
        Engine(target, None).run("hi", RunConfig(drafter="model"))
    with pytest.raises(PromptError, match="context window"):
        engine.run("x" * 600, RunConfig(max_new_tokens=8))


def unequal_pair(target_rows: int, draft_rows: int) -> tuple[LoadedModel, LoadedModel]:
    """One tokenizer, embeddings padded to different sizes (as Qwen2.5-7B's 152,064 rows against
    Qwen2.5-0.5B's 151,936). The padding rows of the larger model are made likely, so that the
    target emits ids the draft cannot embed, or the draft proposes ids the target cannot."""
    def loaded(rows: int, seed: int) -> LoadedModel:
        model = tiny_model("llama", seed, vocab=rows)
        with torch.no_grad():
            model.get_output_embeddings().weight[VOCAB:].mul_(3.0)
        return LoadedModel(model, byte_tokenizer(), f"tiny-{rows}", torch.float32, torch.device("cpu"))

    return loaded(target_rows, 31), loaded(draft_rows, 32)


@pytest.mark.parametrize("rows", [(VOCAB + 8, VOCAB), (VOCAB, VOCAB + 8)])
@pytest.mark.parametrize("drafter", ["hybrid", "model"])
def test_unequal_vocabulary_sizes_stay_lossless(rows: tuple[int, int], drafter: str) -> None:
    target, draft = unequal_pair(*rows)
    engine = Engine(target, draft)
    cfg = RunConfig(drafter=drafter, max_new_tokens=40, draft_vocab=0,
                    tree=TreeConfig(budget=8, root_k=3, top_k=2, min_conf=0.0, cost_aware=False))
    emitted = []
    for prompt in PROMPTS[:3]:
        summary, steps = generate(engine, prompt, cfg)
        assert summary.token_ids == reference(engine, summary.prompt_token_ids, 40)
        assert all(t < rows[0] for s in steps for t in s.tokens), "a draft the target cannot embed"
        emitted += summary.token_ids
        sampled = RunConfig(drafter=drafter, max_new_tokens=24, sampling=SamplingConfig(temperature=1.0, seed=7))
        again = [generate(engine, prompt, sampled)[0].token_ids for _ in range(2)]
        assert again[0] == again[1] and len(again[0]) >= 1
    if rows[0] > rows[1]:
        assert any(t >= VOCAB for t in emitted), "the target must emit ids the draft cannot embed"


def test_the_greedy_readout_is_the_argmax_and_top_k_in_one_copy() -> None:
    """The verdict's readout equals argmax and ``target_topk`` (ties included: the argmax is
    argmax's own), from a single host copy."""
    from talon.core.accept import greedy_readout, target_topk

    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    logits[2, 7] = logits[2, 9] = logits[2].max() + 1.0  # a tie for the top: argmax takes the first
    top1, (ids, probs) = greedy_readout(logits)
    assert top1 == logits.argmax(-1).tolist() and top1[2] == 7
    want_ids, want_probs = target_topk(logits, are_probs=False)
    assert probs == want_probs and ids == want_ids
