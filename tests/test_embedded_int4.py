"""The embedded target packed to int4 from its own Q4_K blocks, with the int8 draft, and the
blocks themselves: its own module, so the float32 pair of ``tests/test_embedded.py`` is released
before it loads."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from talon.bench.judge import TieJudge, default_tie_tol, first_divergence
from talon.engine.engine import Engine, generate
from talon.models.embedded import embedded_pair_paths
from talon.models.loading import load_pair, shipped_blocks
from talon.run_config import RunConfig, TreeConfig
from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET
from tests.tiny import cached_greedy, first_prompt, target_greedy

pytestmark = pytest.mark.embedded


@pytest.fixture(autouse=True)
def forget_references() -> Iterator[None]:
    """The reference texts' cache holds the models it ran: freed with the test."""
    yield
    cached_greedy.cache_clear()


def test_a_packed_int4_embedded_target_keeps_its_own_greedy_text() -> None:
    """The shipped target in int4 from its own Q4_K blocks, bf16 activations: like any bf16
    model, a tree's rows and one-token decoding may round a near-tie differently, so every token
    of Talon's output must be the packed target's argmax or a bf16 near-tie (the benchmark's
    judge, on the packed model itself), and it must match generate() up to the first such tie.
    (int8 passes this on these two prompts but failed the judge on mt_bench prompts at gaps up to
    0.69 logits, ar and talon alike: docs/design.md, Target weights.)"""
    target, draft = load_pair(EMBEDDED_TARGET, EMBEDDED_DRAFT, "auto", "cpu", target_weights="int4", draft_quant="int8")
    assert target.model.talon_quant == "int4-weights-q4k"
    engine = Engine(target, draft)
    judge = TieJudge(target, default_tie_tol(target.dtype))
    assert not judge.upcast  # a packed model is judged as it is
    for suite in ("humaneval",):  # one prompt: the packed forward is the same on every one
        cfg = RunConfig(tree=TreeConfig(cost_aware=False), max_new_tokens=24)
        summary, steps = generate(engine, first_prompt(suite, 1), cfg)
        check = judge.check(summary.prompt_token_ids, summary.token_ids)
        assert check.first_mismatch is None, (suite, check.first_mismatch)
        want = target_greedy(target.model, summary.prompt_token_ids, 24)
        split = first_divergence(want, summary.token_ids)
        assert split is None or split in check.near_ties, (suite, split, check.near_ties)
        assert len(steps) < 24


def test_the_embedded_targets_q4k_blocks_are_its_checkpoint_weights() -> None:
    """int4 target weights keep the shipped integers: the GGUF's Q4_K blocks, decoded, are the
    converted checkpoint's float32 weights bit for bit, and Q6_K layers are not taken as Q4_K."""
    from safetensors import safe_open

    target_dir, _ = embedded_pair_paths()
    blocks = shipped_blocks(target_dir, None)
    assert blocks is not None and blocks.count() == 169  # Q4_K_M: 169 Q4_K tensors, 29 Q6_K
    index = Path(target_dir) / "model.safetensors.index.json"  # shards since the conversion streams
    shard_of = json.loads(index.read_text())["weight_map"] if index.is_file() else {}
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.2.mlp.down_proj", "model.layers.27.mlp.up_proj"):
        shard_file = Path(target_dir) / shard_of.get(f"{name}.weight", "model.safetensors")
        with safe_open(str(shard_file), framework="pt") as shard:  # as converted
            assert torch.equal(blocks.groups(name).dequantize(), shard.get_tensor(f"{name}.weight").float()), name
    assert blocks.groups("model.layers.0.self_attn.v_proj") is None  # Q6_K: packed to int8 instead
    assert blocks.groups("lm_head") is None
