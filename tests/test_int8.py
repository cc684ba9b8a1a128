"""The int8 draft's Linear layers (``talon.models.quant.Int8Linear``): 7-bit activations where
fbgemm's kernel would saturate on 8 (a CPU without VNNI); and since fbgemm quantizes a call's
activations with one scale, a prefill's loud row (the first token's massive activations) is
quantized on its own and the other rows keep their precision; a tree step's few rows keep one call."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from talon.models.quant import LOUD_ROWS, REDUCE_RANGE, Int8Linear, has_vnni, int8_supported

pytestmark = pytest.mark.skipif(not int8_supported(), reason="fbgemm's int8 kernels are not in this torch build")


def row_errors(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """(T,): each row's largest error, relative to its largest output."""
    return (got - want).abs().amax(dim=1) / want.abs().amax(dim=1)


def loud_batch(rows: int) -> tuple[nn.Linear, torch.Tensor]:
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    x = torch.randn(rows, 64)
    x[0] *= 100  # a first token's massive activations
    return linear, x


def test_a_loud_row_leaves_the_prefills_other_rows_their_precision() -> None:
    linear, x = loud_batch(LOUD_ROWS + 8)
    q = Int8Linear(linear)
    with torch.inference_mode():
        want = linear(x)
        got = q(x)
        one_scale = torch.ops.quantized.linear_dynamic(x, q.packed, REDUCE_RANGE)  # one call for all
    assert row_errors(got, want).max() < 0.05
    assert row_errors(one_scale, want)[1:].max() > 0.2
    assert torch.equal(got[:1], torch.ops.quantized.linear_dynamic(x[:1].contiguous(), q.packed, REDUCE_RANGE))


def test_a_tree_steps_few_rows_stay_one_call() -> None:
    linear, x = loud_batch(LOUD_ROWS - 1)
    q = Int8Linear(linear)
    with torch.inference_mode():
        assert torch.equal(q(x[None])[0], torch.ops.quantized.linear_dynamic(x, q.packed, REDUCE_RANGE))


def test_without_vnni_activations_are_quantized_to_seven_bits() -> None:
    """Where fbgemm sums u8 x s8 pairs in int16 (AVX2 without VNNI), 8-bit activations saturate:
    a third of a row's largest output in error, on plain random rows; 7 bits keep it to 3 %."""
    torch.manual_seed(0)
    linear, x = nn.Linear(64, 48), torch.randn(16, 64)
    q = Int8Linear(linear)
    with torch.inference_mode():
        want = linear(x)
        assert row_errors(q(x), want).max() < 0.05
        eight_bits = row_errors(torch.ops.quantized.linear_dynamic(x, q.packed, False), want).max()
    assert REDUCE_RANGE == (not has_vnni())
    if not has_vnni():
        assert eight_bits > 0.2  # the saturation the 7-bit range avoids on this host
