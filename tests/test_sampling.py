"""Sampling on draft trees preserves the target's distribution exactly."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from talon.core.accept import accept_sampling, warp_probs
from talon.engine.engine import Engine
from talon.models import LoadedModel
from talon.run_config import RunConfig, SamplingConfig, TreeConfig
from talon.tree import DraftTree
from tests.tiny import byte_tokenizer, tiny_head, tiny_model


def tv(a: dict, b: dict) -> float:
    keys = set(a) | set(b)
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys)


def null_tv(exact: dict, n: int, quantile: float = 0.999) -> float:
    """The total variation from ``exact`` that ``n`` draws of a correct sampler stay under, but for
    one time in a thousand: simulated from ``exact`` (4,000 seeded multinomial draws). A fixed bound
    is too tight where the outcomes are many (36 outcomes, n = 2,000: a correct sampler averages
    0.053, against the 0.06 these tests once asserted) and loose where they are few."""
    p = np.array(list(exact.values()), dtype=np.float64)
    p = p / p.sum()
    draws = np.random.default_rng(0).multinomial(n, p, size=4000) / n
    return float(np.quantile(0.5 * np.abs(draws - p).sum(axis=1), quantile))


def test_warp_matches_definition() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    p = warp_probs(logits, 0.5, 0, 1.0)
    torch.testing.assert_close(p, torch.softmax(logits.double() / 0.5, -1))
    p = warp_probs(logits, 1.0, 2, 1.0)
    assert p[0, 2:].sum() == 0 and abs(float(p[0, 0] / p[0, 1]) - float(torch.e)) < 1e-9
    p = warp_probs(logits, 1.0, 0, 0.6)  # top token has ~0.55: the nucleus needs the top two
    assert (p[0] > 0).tolist() == [True, True, False, False, False]


def sample_first_two(p_root: torch.Tensor, p_child: dict[int, torch.Tensor], tree: DraftTree, n: int) -> dict:
    g = torch.Generator().manual_seed(0)
    counts: dict[tuple[int, int], float] = {}
    for _ in range(n):
        rows = [p_root] + [p_child[tree.tokens[i]] for i in range(1, len(tree))]
        acc = accept_sampling(tree, torch.stack(rows), g)
        toks = [tree.tokens[i] for i in acc.accepted[1:]] + [acc.bonus_token]
        if len(toks) == 1:  # nothing accepted: the second token comes from the bonus's distribution
            toks.append(int(torch.multinomial(p_child[toks[0]], 1, generator=g)))
        key = (toks[0], toks[1])
        counts[key] = counts.get(key, 0.0) + 1.0 / n
    return counts


def test_acceptance_rule_preserves_distribution_and_a_naive_rule_does_not() -> None:
    torch.manual_seed(0)
    vocab = 5
    p_root = torch.softmax(torch.randn(vocab, dtype=torch.float64) * 1.5, -1)
    p_child = {t: torch.softmax(torch.randn(vocab, dtype=torch.float64) * 1.5, -1) for t in range(vocab)}
    tree = DraftTree.with_root(0)
    a = tree.add(0, 2, 0.5, "model")
    tree.add(0, 0, 0.3, "model")
    tree.add(0, 4, 0.1, "retrieval")
    tree.add(a, 1, 0.6, "model")
    tree.add(a, 3, 0.2, "model")
    exact = {(x, y): float(p_root[x] * p_child[x][y]) for x, y in itertools.product(range(vocab), repeat=2)}
    got = sample_first_two(p_root, p_child, tree, 20000)
    assert tv(got, exact) < null_tv(exact, 20000) < 0.02
    # The rule is what makes this hold: always taking the first draft is visibly biased.
    biased = {k: (1.0 if k[0] == 2 else 0.0) * float(p_child[2][k[1]]) for k in exact}
    assert tv(biased, exact) > 0.1 and tv(got, biased) > 0.1


@pytest.mark.parametrize(
    ("sampling", "step", "drafter"),
    # warped on both steps; unwarped with the target drafting for itself (the unwarped rule on the
    # draft model is the acceptance rule's own test above: one acceptance path serves every drafter)
    [(SamplingConfig(temperature=0.7, top_k=4, top_p=0.9, seed=0), "dynamic", "model"),
     (SamplingConfig(temperature=0.7, top_k=4, top_p=0.9, seed=0), "static", "model"),  # the static forward too
     (SamplingConfig(temperature=1.0, seed=0), "dynamic", "layerskip"),  # the target drafts for itself
     (SamplingConfig(temperature=0.7, top_k=4, top_p=0.9, seed=0), "dynamic", "eagle3")],  # a head on its features
)
def test_speculative_sampling_matches_target_distribution_end_to_end(sampling: SamplingConfig, step: str,
                                                                     drafter: str) -> None:
    vocab = 6
    layers = 4 if drafter in ("layerskip", "eagle3") else 2  # a view of four layers skips one; a head reads 2, 2, 1
    target = LoadedModel(tiny_model("llama", 21, vocab=vocab, layers=layers), byte_tokenizer(), "t", torch.float32,
                         torch.device("cpu"))
    drafting = tiny_head(target.model, 22) if drafter == "eagle3" else tiny_model("llama", 22, vocab=vocab)
    draft = LoadedModel(drafting, byte_tokenizer(), "d", torch.float32, torch.device("cpu"))
    with torch.no_grad():  # flatten the target a little so many outcomes are likely
        target.model.get_output_embeddings().weight.mul_(0.15)
    prompt = [1, 4, 2, 0, 3]
    with torch.inference_mode():
        l1 = target.model(torch.tensor([prompt])).logits[0, -1]
        p1 = warp_probs(l1[None], sampling.temperature, sampling.top_k, sampling.top_p)[0]
        exact = {}
        for x in range(vocab):
            l2 = target.model(torch.tensor([prompt + [x]])).logits[0, -1]
            p2 = warp_probs(l2[None], sampling.temperature, sampling.top_k, sampling.top_p)[0]
            for y in range(vocab):
                exact[(x, y)] = float(p1[x] * p2[y])
    engine = Engine(target, draft, forward=step)
    tree = TreeConfig(mode="adaptive", budget=4, root_k=3, top_k=2, mu=0.0, max_depth=3, cost_aware=False)
    n = 2000
    counts: dict = {}
    accepted_drafts = 0
    for seed in range(n):
        cfg = RunConfig(drafter=drafter, tree=tree, max_new_tokens=2,
                        sampling=SamplingConfig(**{**sampling.__dict__, "seed": seed}))
        run = engine.run(prompt, cfg)
        for step in run:
            accepted_drafts += step.accept_len
        key = tuple(run.summary.token_ids[:2])
        counts[key] = counts.get(key, 0.0) + 1.0 / n
    assert accepted_drafts > n // 4, "the test must exercise accepted drafts, not only bonus tokens"
    bound = null_tv(exact, n)
    assert bound < 0.1, "n too small to tell a biased sampler (the naive rule's bias: over 0.1)"
    assert tv(counts, exact) < bound, (tv(counts, exact), bound)


def test_same_seed_same_output() -> None:
    target = LoadedModel(tiny_model("qwen2", 5), byte_tokenizer(), "t", torch.float32, torch.device("cpu"))
    draft = LoadedModel(tiny_model("qwen2", 6), byte_tokenizer(), "d", torch.float32, torch.device("cpu"))
    engine = Engine(target, draft)
    outs = []
    for seed in (3, 3, 4):
        cfg = RunConfig(drafter="hybrid", max_new_tokens=30, sampling=SamplingConfig(temperature=1.0, seed=seed))
        run = engine.run("abcabcabc", cfg)
        for _ in run:
            pass
        outs.append(run.summary.token_ids)
    assert outs[0] == outs[1] and outs[0] != outs[2]
