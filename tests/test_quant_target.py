"""The target at the precision it ships in (``talon.models.quant``, ``--target-weights``): packed
int8 and int4 layers give each row what it alone would get, so a tree verified in one forward
agrees with decoding one token at a time; and speculative decoding of a packed target is token for
token its own greedy ``generate`` for every drafter and tree mode."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from torch import nn

from talon.cost.model import CostModel
from talon.cost.probe import cost_key, probe_costs
from talon.figures.cost import cost_figure
from talon.models.gguf_blocks import Q4K_BYTES, Int4Groups, q4k_groups
from talon.models.quant import PackedLinear, nearest_int4, quantize_target, resolve_target_weights
from talon.run_config import ConfigError
from talon.settings import Settings
from tests.tiny import assert_decodes_own_generate, tiny_loaded


@pytest.mark.parametrize("bits, weight_only", [(8, False), (8, True), (4, False)])
def test_a_packed_row_is_the_same_alone_or_in_a_tree(bits: int, weight_only: bool) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(256, 192, bias=True)
    packed = PackedLinear(linear, bits, torch.float32, weight_only=weight_only)
    rows = torch.randn(17, 256)
    together = packed(rows)
    for i in range(rows.shape[0]):
        assert torch.equal(packed(rows[i : i + 1])[0], together[i])  # exact, not close
    dense = linear(rows)
    error = (together - dense).abs().max() / dense.abs().max()
    assert error < (0.03 if bits == 8 else 0.15), f"{bits}-bit layer far from the dense one: {error:.3f}"


class ShippedBlocks:
    """Stands in for a GGUF's Q4_K blocks on a tiny model: the attention's q and k and the MLP's
    gate and up come as int4 groups (as a Q4_K_M file ships them); every other layer does not."""

    SHIPPED = ("q_proj", "k_proj", "gate_proj", "up_proj")

    def __init__(self, model: nn.Module) -> None:
        self.weights = {name: m.weight.detach().float() for name, m in model.named_modules()
                        if isinstance(m, nn.Linear)}
        self.path = Path("tiny.gguf")

    def groups(self, name: str) -> Int4Groups | None:
        return nearest_int4(self.weights[name]) if name.endswith(self.SHIPPED) else None


def packed_target(weights: str):
    if weights == "int4-q4k":
        lm = tiny_loaded("llama", 0)
        return quantize_target(lm, "int4", torch.float32, blocks=ShippedBlocks(lm.model))
    return quantize_target(tiny_loaded("llama", 0), weights, torch.float32)


def q4k_block(rng: np.random.Generator) -> np.ndarray:
    """One Q4_K block, byte by byte as llama.cpp's block_q4_K lays it out."""
    d, dmin = np.float16(rng.uniform(0.01, 0.1)), np.float16(rng.uniform(0.01, 0.1))
    sc, m = rng.integers(0, 64, 8), rng.integers(0, 64, 8)
    scales = np.zeros(12, dtype=np.uint8)
    for j in range(4):  # scales/mins 0..3: low 6 bits of bytes 0..3 / 4..7
        scales[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6)
        scales[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6)
        scales[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4)  # 4..7: low 4 bits here, high 2 above
    q = rng.integers(0, 16, 256)
    qs = np.zeros(128, dtype=np.uint8)
    for c in range(4):  # 32 bytes per pair of sub-blocks: 2c in the low nibble, 2c+1 in the high
        qs[32 * c : 32 * c + 32] = q[64 * c : 64 * c + 32] | (q[64 * c + 32 : 64 * c + 64] << 4)
    block = np.concatenate([np.array([d, dmin]).view(np.uint8), scales, qs])
    assert block.size == Q4K_BYTES
    expected = np.concatenate([float(d) * sc[s] * q[32 * s : 32 * s + 32] - float(dmin) * m[s] for s in range(8)])
    return block, expected


def test_q4k_blocks_decode_to_the_integers_and_scales_llama_cpp_wrote() -> None:
    rng = np.random.default_rng(0)
    blocks, expected = zip(*(q4k_block(rng) for _ in range(16 * 3)))  # 16 rows x 3 blocks of 256
    raw = np.stack(blocks).reshape(16, 3 * Q4K_BYTES)
    groups = q4k_groups(raw, 16, 768)
    assert groups.q.shape == (16, 768) and groups.scale.shape == (16, 24)
    assert int(groups.q.min()) >= 0 and int(groups.q.max()) <= 15
    by_hand = np.concatenate(expected).reshape(16, 768)
    np.testing.assert_allclose(groups.dequantize().numpy(), by_hand, rtol=1e-6, atol=1e-6)
    by_gguf = dequantize(raw, GGMLQuantizationType.Q4_K).reshape(16, 768)  # the gguf package's own decoder
    assert np.array_equal(groups.dequantize().numpy(), by_gguf)  # bit for bit
    packed = PackedLinear(nn.Linear(768, 16, bias=False), 4, torch.float32, groups)
    x = torch.randn(3, 768, generator=torch.Generator().manual_seed(0))
    want = x @ torch.from_numpy(by_gguf).t()
    # the kernel rounds its group scales (seen: 3.5e-3 at outputs near 10); a wrong decode is off by whole steps
    assert (packed(x) - want).abs().max() < 1e-3 * want.abs().max()


@pytest.mark.parametrize("weights", ["int8", "int4", "int4-q4k"])
@pytest.mark.parametrize("drafter", ["hybrid", "model", "retrieval"])
@pytest.mark.parametrize("tree", ["adaptive", "static", "chain"])
def test_a_packed_target_decodes_its_own_greedy_generate(weights: str, drafter: str, tree: str) -> None:
    target = packed_target(weights)
    bits = [m.bits for m in target.model.modules() if isinstance(m, PackedLinear)]
    if weights == "int4-q4k":  # shipped layers keep their groups, every other one weight-only int8, the head too
        assert bits.count(4) == 2 * 4 and bits.count(8) == 2 * 3 + 1
        assert all(m.weight_only for m in target.model.modules() if isinstance(m, PackedLinear) and m.bits == 8)
    else:  # 2 layers x 7, and the head (258 rows: not whole int4 tiles)
        assert len(bits) == 2 * 7 + (weights == "int8")
    assert_decodes_own_generate(target, tiny_loaded("llama", 0), drafter, tree)  # the float weights: drafts accepted


def test_the_weight_mode_is_in_the_cost_key_and_bad_modes_are_refused() -> None:
    dense = tiny_loaded("llama", 0)
    targets = (dense, packed_target("int8"), packed_target("int4"), packed_target("int4-q4k"))
    keys = {cost_key(m.model, None, ("t", "none")) for m in targets}
    assert len(keys) == 4
    assert resolve_target_weights("auto", torch.device("cpu")) == "dense"
    assert resolve_target_weights("auto", torch.device("meta")) == "dense"
    with pytest.raises(ConfigError, match="need the CPU"):
        resolve_target_weights("int4", torch.device("meta"))
    with pytest.raises(ConfigError, match="one of"):
        resolve_target_weights("int3", torch.device("cpu"))
    with pytest.raises(ConfigError, match="int8 target weights are not offered"):  # not lossless on a real model
        resolve_target_weights("int8", torch.device("cpu"))
    assert Settings.from_env({"TALON_TARGET_WEIGHTS": "INT4"}).target_weights == "int4"
    with pytest.raises(ConfigError, match="TALON_TARGET_WEIGHTS"):
        Settings.from_env({"TALON_TARGET_WEIGHTS": "fp8"})
    with pytest.raises(ConfigError, match="TALON_TARGET_WEIGHTS"):
        Settings.from_env({"TALON_TARGET_WEIGHTS": "int8"})
    assert copy.deepcopy(Settings()).target_weights == "dense"


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_the_cost_probe_measures_a_packed_target(weights: str) -> None:
    target = packed_target(weights)
    costs = probe_costs(target.model, tiny_loaded("llama", 1).model, 0, max_reps=2)
    assert all(costs.verify_s(n) > 0 for n in (1, 8, 32)) and costs.draft is not None
    # the cost view names the weights its curves were measured on, and they survive a trace's JSON
    assert (costs.provenance.weights == f"{weights}-weights"
            and f"target {weights}-weights" in costs.provenance.describe())
    title = cost_figure(CostModel.from_dict(costs.to_dict()).to_dict(), []).layout.title.text
    assert f"target {weights}-weights" in title
