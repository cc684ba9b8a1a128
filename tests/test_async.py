"""Asynchronous pre-drafting: lossless, reuses bets that come true, never leaks a thread."""

from __future__ import annotations

import threading

import pytest
import torch

from talon.engine.engine import Engine, generate
from talon.run_config import RunConfig, SamplingConfig, TreeConfig
from tests.tiny import PROMPTS, noisy_copy, reference, tiny_loaded


def drafter_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("talon-drafter")]


@pytest.fixture(scope="module")
def async_engine() -> Engine:
    target = tiny_loaded("qwen2", 31)
    return Engine(target, noisy_copy(target, 32, 0.15))


@pytest.mark.parametrize("mode", ["adaptive", "static", "chain"])
@pytest.mark.parametrize("drafter", ["model", "hybrid"])
def test_async_greedy_equals_sync_and_target(async_engine: Engine, mode: str, drafter: str) -> None:
    tree = TreeConfig(mode=mode, budget=8, root_k=3, top_k=2, mu=0.05, max_depth=5)
    reused = 0
    for prompt in PROMPTS:
        cfg = RunConfig(drafter=drafter, tree=tree, max_new_tokens=40)
        sync, _ = generate(async_engine, prompt, cfg)
        run = async_engine.run(prompt, cfg.replace(async_draft=True))
        steps = list(run)
        assert run.summary.token_ids == sync.token_ids == reference(async_engine, sync.prompt_token_ids, 40)
        reused += sum(1 for s in steps if s.predraft_reused)
        assert all(s.predraft_reused is not None for s in steps[1:])
        assert all(len(s.tokens) - 1 <= tree.budget for s in steps)
    assert reused > 0, "a close draft model must see some pre-drafts reused"
    assert not drafter_threads()


def test_async_sampling_is_reproducible(async_engine: Engine) -> None:
    cfg = RunConfig(drafter="model", max_new_tokens=30, async_draft=True,
                    sampling=SamplingConfig(temperature=0.8, seed=5))
    a, _ = generate(async_engine, PROMPTS[0], cfg)
    b, _ = generate(async_engine, PROMPTS[0], cfg)
    assert a.token_ids == b.token_ids


@pytest.mark.parametrize("stop", ["eos", "stop_string", "max_new_tokens", "cancel", "abandon"])
def test_no_thread_left_behind(async_engine: Engine, stop: str) -> None:
    cfg = RunConfig(drafter="model", max_new_tokens=25, async_draft=True)
    cancel = threading.Event()
    if stop == "stop_string":
        text = generate(async_engine, PROMPTS[1], cfg.replace(async_draft=False))[0].text
        cfg = cfg.replace(stop_strings=(text[5:8],))
    if stop == "eos":
        prompt_ids = async_engine.run(PROMPTS[1], cfg).prompt_ids
        async_engine.target.model.generation_config.eos_token_id = reference(async_engine, prompt_ids, 25)[6]
    try:
        run = async_engine.run(PROMPTS[1], cfg, cancel)
        for i, _ in enumerate(run):
            if stop == "cancel" and i == 2:
                cancel.set()
            if stop == "abandon" and i == 2:
                break
        if stop == "abandon":
            del run  # the generator is closed: its finally shuts the drafter thread down
            import gc

            gc.collect()
        else:
            expected = {"eos": "eos", "stop_string": "stop_string", "max_new_tokens": "max_new_tokens",
                        "cancel": "cancelled"}
            assert run.summary.stop_reason == expected[stop]
    finally:
        async_engine.target.model.generation_config.eos_token_id = 256
    assert not drafter_threads()


def test_drafter_error_surfaces_and_threads_end(async_engine: Engine, monkeypatch) -> None:
    from talon.drafters import tree_drafter

    def boom(self, pre, clock):
        raise RuntimeError("draft model exploded")

    monkeypatch.setattr(tree_drafter.TreeDrafter, "grow", boom)
    with pytest.raises(RuntimeError, match="exploded"):
        generate(async_engine, PROMPTS[0], RunConfig(drafter="model", max_new_tokens=20, async_draft=True))
    assert not drafter_threads()


def test_verifier_error_surfaces_and_threads_end(async_engine: Engine, monkeypatch) -> None:
    from talon.core import verify as decode  # verify_tree is looked up in talon.core.verify

    calls = {"n": 0}
    real = decode.verify_tree

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.cuda.OutOfMemoryError("simulated out of memory")
        return real(*args, **kwargs)

    monkeypatch.setattr(decode, "verify_tree", flaky)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        generate(async_engine, PROMPTS[0], RunConfig(drafter="model", max_new_tokens=30, async_draft=True))
    assert not drafter_threads()
