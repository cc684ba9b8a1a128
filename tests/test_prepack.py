"""Float32 weights laid out once for oneDNN (``talon.models.prepack``, ``TALON_PREPACK``): the
same products as torch's matmul up to the order of the sums, a row's result the same in a tree of
any width from two rows up, and a prepacked target decoding token for token its own greedy
``generate`` for every drafter and tree mode."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from talon.cost_probe import cost_key
from talon.models import load_pair
from talon.models.prepack import PREPACKED, PrepackedLinear, is_prepacked, prepack, prepack_supported, should_prepack
from talon.models.quant import quantize_draft
from talon.run_config import ConfigError
from talon.settings import Settings
from talon.verify import head_rows, lm_logits
from tests.test_app import save_tiny_pair
from tests.tiny import assert_decodes_own_generate, tiny_loaded

pytestmark = pytest.mark.skipif(not prepack_supported(), reason="this torch build has no oneDNN CPU linear")


@pytest.mark.parametrize("bias", [False, True])
def test_a_prepacked_layer_computes_the_layer(bias: bool) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(320, 200, bias=bias)
    packed = PrepackedLinear(linear)
    assert not hasattr(packed, "weight")  # the plain copy is not kept (only a head keeps it)
    for shape in ((1, 320), (5, 320), (1, 7, 320), (2, 3, 320)):
        x = torch.randn(shape)
        got, want = packed(x), linear(x)
        assert got.shape == want.shape
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (got - want).abs().max()
    x = torch.randn(320, 6).t()  # a non-contiguous input
    assert torch.allclose(packed(x), linear(x), rtol=1e-5, atol=1e-5)


def test_a_row_is_the_same_in_a_tree_of_any_width_from_two_rows() -> None:
    torch.manual_seed(1)
    packed = PrepackedLinear(nn.Linear(512, 384, bias=True))
    rows = torch.randn(40, 512)
    together = packed(rows)
    for width in (2, 3, 4, 8, 17, 33):
        assert torch.equal(packed(rows[:width]), together[:width]), width  # exact, not close


def prepacked_target(seed: int = 0):
    lm = tiny_loaded("llama", seed)
    plain = tiny_loaded("llama", seed)
    assert prepack(lm.model) == 2 * 7 + 1  # 7 Linear layers a decoder layer, and the head
    return lm, plain


def test_prepacking_a_model_keeps_the_model() -> None:
    lm, plain = prepacked_target()
    assert is_prepacked(lm.model) and lm.model.talon_quant == PREPACKED
    assert not any(type(m) is nn.Linear for m in lm.model.modules())
    head = lm.model.get_output_embeddings()
    assert isinstance(head, PrepackedLinear) and head.weight is not None  # rows sliced for a draft's vocabulary
    assert head_rows(lm.model) == head_rows(plain.model)
    ids = torch.tensor([[5, 9, 77, 3, 200, 41, 41, 7]])
    with torch.inference_mode():
        got, want = lm.model(ids).logits, plain.model(ids).logits
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4), (got - want).abs().max()
        hidden = lm.model.model(ids).last_hidden_state[0]
        assert torch.allclose(lm_logits(lm.model, hidden), got[0], rtol=1e-5, atol=1e-5)
        assert torch.allclose(lm_logits(lm.model, hidden, 100), got[0, :, :100], rtol=1e-4, atol=1e-4)
    assert cost_key(lm.model, None, ("t", "none")) != cost_key(plain.model, None, ("t", "none"))  # re-measured


@pytest.mark.parametrize("drafter", ["hybrid", "model", "retrieval", "layerskip"])
@pytest.mark.parametrize("tree", ["adaptive", "static", "chain"])
def test_a_prepacked_target_decodes_its_own_greedy_generate(drafter: str, tree: str) -> None:
    target, _ = prepacked_target()
    draft = tiny_loaded("llama", 1)
    prepack(draft.model)
    assert_decodes_own_generate(target, None if drafter == "layerskip" else draft, drafter, tree)


def test_what_gets_prepacked() -> None:
    lm = tiny_loaded("llama", 0)
    assert should_prepack(lm.model) and not should_prepack(lm.model, enabled=False)
    assert not should_prepack(quantize_draft(tiny_loaded("llama", 1)).model)  # int8 keeps its own kernels
    assert not should_prepack(tiny_loaded("llama", 2).model.to(torch.bfloat16))
    prepack(lm.model)
    assert not should_prepack(lm.model)  # once


def test_load_pair_prepacks_unless_told_not_to(tmp_path: Path) -> None:
    target_dir, draft_dir = save_tiny_pair(tmp_path)
    t, d = load_pair(str(target_dir), str(draft_dir), "float32", "cpu", draft_quant="none")
    assert is_prepacked(t.model) and is_prepacked(d.model)
    t, d = load_pair(str(target_dir), str(draft_dir), "float32", "cpu", draft_quant="int8")
    assert is_prepacked(t.model) and d.model.talon_quant == "int8"
    t, d = load_pair(str(target_dir), str(draft_dir), "float32", "cpu", draft_quant="none", prepack=False)
    assert not is_prepacked(t.model) and not is_prepacked(d.model)
    assert any(type(m) is nn.Linear for m in t.model.modules())


def test_the_setting() -> None:
    assert Settings().prepack and Settings.from_env({}).prepack
    assert not Settings.from_env({"TALON_PREPACK": "0"}).prepack
    with pytest.raises(ConfigError, match="TALON_PREPACK"):
        Settings.from_env({"TALON_PREPACK": "maybe"})
