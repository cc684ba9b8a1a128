"""The target at the precision it ships in (``talon.models.quant``, ``--target-weights``): packed
int8 and int4 layers give each row what it alone would get, so a tree verified in one forward
agrees with decoding one token at a time; and speculative decoding of a packed target is token for
token its own greedy ``generate`` for every drafter and tree mode."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from talon.cost import cost_key, probe_costs
from talon.decode import Engine, generate
from talon.models.quant import PackedLinear, quantize_target, resolve_target_weights
from talon.run_config import ConfigError, RunConfig, TreeConfig
from talon.settings import Settings
from tests.tiny import tiny_loaded

BITS = (8, 4)


@pytest.mark.parametrize("bits", BITS)
def test_a_packed_row_is_the_same_alone_or_in_a_tree(bits: int) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(256, 192, bias=True)
    packed = PackedLinear(linear, bits, torch.float32)
    rows = torch.randn(17, 256)
    together = packed(rows)
    for i in range(rows.shape[0]):
        assert torch.equal(packed(rows[i : i + 1])[0], together[i])  # exact, not close
    dense = linear(rows)
    error = (together - dense).abs().max() / dense.abs().max()
    assert error < (0.03 if bits == 8 else 0.15), f"{bits}-bit layer far from the dense one: {error:.3f}"


def packed_target(weights: str):
    return quantize_target(tiny_loaded("llama", 0), weights, torch.float32)


@pytest.mark.parametrize("weights", ["int8", "int4"])
@pytest.mark.parametrize("drafter", ["hybrid", "model", "retrieval"])
@pytest.mark.parametrize("tree", ["adaptive", "static", "chain"])
def test_a_packed_target_decodes_its_own_greedy_generate(weights: str, drafter: str, tree: str) -> None:
    target = packed_target(weights)
    packed = sum(isinstance(m, PackedLinear) for m in target.model.modules())
    assert packed == 2 * 7 + (weights == "int8")  # 2 layers x 7, and the head (258 rows: not whole int4 tiles)
    prompt = "abc abc abc abc abd"
    ids = target.tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        want = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=32)[0, ids.shape[1]:].tolist()
    engine = Engine(target, tiny_loaded("llama", 1), costs=None)
    cfg = RunConfig(drafter=drafter, max_new_tokens=32, chat_template=False,
                    tree=TreeConfig(mode=tree, budget=12, cost_aware=False))
    summary, steps = generate(engine, prompt, cfg)
    assert summary.token_ids == want[: len(summary.token_ids)]
    assert len(summary.token_ids) == 32 or summary.stop_reason == "eos"


def test_the_weight_mode_is_in_the_cost_key_and_bad_modes_are_refused() -> None:
    dense = tiny_loaded("llama", 0)
    keys = {cost_key(m.model, None, ("t", "none")) for m in (dense, packed_target("int8"), packed_target("int4"))}
    assert len(keys) == 3
    assert resolve_target_weights("auto", torch.device("cpu")) == "int8"
    assert resolve_target_weights("auto", torch.device("meta")) == "dense"
    with pytest.raises(ConfigError, match="need the CPU"):
        resolve_target_weights("int4", torch.device("meta"))
    with pytest.raises(ConfigError, match="one of"):
        resolve_target_weights("int3", torch.device("cpu"))
    assert Settings.from_env({"TALON_TARGET_WEIGHTS": "INT4"}).target_weights == "int4"
    with pytest.raises(ConfigError, match="TALON_TARGET_WEIGHTS"):
        Settings.from_env({"TALON_TARGET_WEIGHTS": "fp8"})
    assert copy.deepcopy(Settings()).target_weights == "dense"


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_the_cost_probe_measures_a_packed_target(weights: str) -> None:
    target = packed_target(weights)
    costs = probe_costs(target.model, tiny_loaded("llama", 1).model, 0)
    assert all(costs.verify_s(n) > 0 for n in (1, 8, 32)) and costs.draft is not None
