"""Dense float32 weights on a CPU, laid out once for oneDNN's matmul (:class:`PrepackedLinear`).

A tree verification multiplies every weight matrix by a few rows at once (one per node). For a
float32 product torch's CPU ``F.linear`` calls MKL's sgemm, which lays the weight out again on
every call unless the product is a single row; at a few rows that costs more than the rows do.
Measured on a 2-core Xeon (avx512 without avx512_bf16) with the
embedded 1.5B target over a 256-token cache, a forward of 4 / 8 / 16 / 64 tokens took 1.9x / 2.8x /
2.1x / 4.9x a 1-token one. Reordered once into oneDNN's blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``) and applied by ``torch.ops.mkldnn._linear_pointwise``,
the same forwards took 0.71x / 0.55x / 0.86x / 0.78x of that time; one token 0.95x to 1.06x over
four runs, two tokens 1.2x (docs/design.md, Prepacked weights).

The weights are the model's own, exactly, in float32: only their layout and the order of each
dot product's additions change, as they change between any two matmul kernels. A prepacked model
*is* the target: ``generate()`` runs through the same modules, and a row's result does not
depend on how many rows share the call once there are two or more (tests/test_prepack.py); one
row takes oneDNN's other path, as it takes MKL's gemv without prepacking.

bfloat16 is left to torch (on a host with avx512_bf16 it already goes to oneDNN; unmeasured
here), and so is every device but the CPU.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from talon.models.quant import replace_linears

log = logging.getLogger(__name__)

PREPACKED = "dense-onednn"  # a prepacked model's ``talon_quant``: the cost cache keys on it


class PrepackedLinear(nn.Module):
    """y = x @ W.T + b with W held in oneDNN's blocked layout (float32, CPU). ``keep_weight``
    keeps the plain ``weight`` too (an LM head: its rows are sliced for a draft's vocabulary and
    read for shapes; tied to the embeddings it costs nothing)."""

    def __init__(self, linear: nn.Linear, keep_weight: bool = False) -> None:
        super().__init__()
        with torch.no_grad():
            # laid out for one row, the decode step: measured no slower than plain at 1 row and
            # within 10 % of a layout for 4, 8 or 64 rows at those sizes
            self.blocked = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach())
        if keep_weight:
            self.weight = linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.blocked, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, onednn blocked"


def prepack_supported() -> bool:
    """This torch build has oneDNN's CPU linear with a reordered weight."""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and all(
        hasattr(ops, name) for name in ("_reorder_linear_weight", "_linear_pointwise"))


def should_prepack(model: nn.Module, enabled: bool = True) -> bool:
    """Prepack ``model``: asked to, a float32 model on the CPU, not quantized, and supported."""
    return (enabled and getattr(model, "talon_quant", "none") == "none" and model.device.type == "cpu"
            and model.dtype == torch.float32 and prepack_supported())


def prepack(model: nn.Module) -> int:
    """Every ``nn.Linear`` of ``model`` (its decoder and LM head) as a :class:`PrepackedLinear`,
    in place; the plain weights of all but the head are freed. Returns how many were replaced."""
    head = model.get_output_embeddings()
    replaced = 0

    def make(_: str, linear: nn.Linear) -> PrepackedLinear | None:
        nonlocal replaced
        if linear.weight.dtype != torch.float32:
            return None
        replaced += 1
        return PrepackedLinear(linear, keep_weight=linear is head)

    replace_linears(model, make)
    model.talon_quant = PREPACKED
    log.info("%s: %d float32 Linear layers laid out for oneDNN", type(model).__name__, replaced)
    return replaced


def is_prepacked(model: nn.Module) -> bool:
    return getattr(model, "talon_quant", None) == PREPACKED
