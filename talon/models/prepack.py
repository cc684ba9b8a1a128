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

On a 2-core AMD EPYC the same layout took one token's forward to 0.51x and a 16-token one to
0.43x: hosts differ, so ``TALON_PREPACK=auto`` (the default) prepacks where ``prepack_pays``, a
timed check of one layer, says it pays here (docs/runs/2026-11-27-cpu-prepack-ab.md). The check
runs three times, once per host, CPU and torch, and its verdict is kept in the cache: a one-off
check flipped with the host's load from one start to the next (0.26x to 2.71x at one row).

bfloat16 is left to torch (on a host with avx512_bf16 it already goes to oneDNN; unmeasured
here), and so is every device but the CPU.
"""

from __future__ import annotations

import functools
import logging
import time

import torch
from torch import nn

from talon.models.quant import replace_linears
from talon.models.rng import generator_for
from talon.models.verdict import VERDICT_ROUNDS, HostVerdict, RowsRule, Times, host_key, kept_verdict

logger = logging.getLogger(__name__)

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


def should_prepack(model: nn.Module, enabled: bool | None = True) -> bool:
    """Prepack ``model``: asked to (``None``: where this host's check says it pays,
    :func:`prepack_pays`), a float32 model on the CPU, not quantized, and supported."""
    if enabled is False:
        return False
    fits = (getattr(model, "talon_quant", "none") == "none" and model.device.type == "cpu"
            and model.dtype == torch.float32 and prepack_supported())
    return fits and (enabled or prepack_pays())


# The rows a decoder's linears see on a CPU: one token (plain decoding, a draft layer) and a
# tree's verification. Prepacking must win at the tree's rows and not lose at one row.
LAYOUT_RULE = RowsRule(tree_speedup=1.1, row_slowdown=1.05)  # (plain, prepacked) seconds at 1 and 16 rows
CHECK_ROWS = LAYOUT_RULE.rows


def time_layer(rows: int, dim: int = 4096, reps: int = 6) -> tuple[float, float]:
    """Best seconds of one (rows x dim) @ (dim x dim) float32 linear, torch's default matmul and
    prepacked, timed in alternating rounds (a burst of load from elsewhere hits both). The
    weight (64 MB) is larger than the CPU's caches, as a decoder's weights are."""
    g = generator_for("cpu", 0)  # this check runs on the CPU only
    x = torch.randn(rows, dim, generator=g)  # (rows, dim)
    layer = nn.Linear(dim, dim, bias=False, device="meta")  # no init: the global generator stays as it was
    layer.weight = nn.Parameter(torch.randn(dim, dim, generator=g), requires_grad=False)
    packed = PrepackedLinear(layer)
    best = [float("inf"), float("inf")]
    with torch.inference_mode():
        for i in range(reps + 1):
            for k, fn in enumerate((layer, packed)):
                start = time.perf_counter()
                fn(x)
                if i:  # the first round warms kernels and caches
                    best[k] = min(best[k], time.perf_counter() - start)
    return best[0], best[1]


def pays(times: Times) -> bool:
    """Prepacking pays on these (plain, prepacked) seconds by rows: clearly faster at a tree's
    rows, and not slower at one."""
    return LAYOUT_RULE.pays(times)


def decide(rounds: list[Times]) -> tuple[bool, float]:
    """On where every round pays, with the smallest round's margin; rounds that disagree are inside
    the noise, and that means off."""
    return all(pays(times) for times in rounds), min(LAYOUT_RULE.margin(times) for times in rounds)


@functools.cache
def prepack_pays() -> bool:
    """Decided once per host (``host_key``: CPU, cores, torch) and kept in ``TALON_COST_CACHE/prepack``
    with its figures, so that every start of the app on a host decides alike: whether this host's
    oneDNN layout beats torch's default float32 matmul (MKL's sgemm re-lays a weight out at every
    call of a few rows on some hosts, not on others). The check runs ``VERDICT_ROUNDS`` times; a
    verdict the rounds disagree on is inside the noise, and that is off. Logged either way."""
    if not prepack_supported():
        return False
    return kept_verdict("prepack", host_key(), check_layout, logger, "TALON_PREPACK auto = %s")


def check_layout() -> HostVerdict:
    """The layout check, ``VERDICT_ROUNDS`` rounds of ``CHECK_ROWS``, logged with its figures."""
    rounds = [{rows: time_layer(rows) for rows in CHECK_ROWS} for _ in range(VERDICT_ROUNDS)]
    return LAYOUT_RULE.judge(rounds, "CPU layout check, (rows x 4096)@(4096x4096) float32 linear, plain / prepacked",
                             logger, ("TALON_PREPACK auto = off", "TALON_PREPACK auto = on"))


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
    logger.info("%s: %d float32 Linear layers laid out for oneDNN", type(model).__name__, replaced)
    return replaced


def is_prepacked(model: nn.Module) -> bool:
    return getattr(model, "talon_quant", None) == PREPACKED
