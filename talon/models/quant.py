"""Fewer bytes per step on a CPU: an int8 draft, and a target kept packed (``PackedLinear``, at
the end of this module).

A quantized draft changes which tokens are proposed (acceptance may move a little), never which
are accepted, so the output stays exactly the target's. A packed target *is* the target: the
output is its own greedy ``generate``, which ``PackedLinear``'s row-independent sums make exact.

Each ``nn.Linear`` of the decoder body becomes an :class:`Int8Linear`: weights quantized per
output channel to int8 once, activations quantized on the fly per call, and the product computed by
fbgemm's int8 GEMM (``torch.ops.quantized.linear_dynamic``, the kernel behind torch's dynamic
quantization, used here directly rather than through the deprecated ``torch.ao.quantization``
front end). Activations stay float32, so the quantized draft runs in float32 around its int8
matmuls; embeddings and norms are untouched. The LM head gets an int8 copy too, one per draft
vocabulary size asked for (:func:`int8_head`, built on first use): in float32 the first 32,768
rows of Qwen's head cost 8 ms of a 30 ms draft forward at width 1 and 19 ms at width 4 (a
117 MB weight read per call), in int8 0.5 ms; the embedding matrix it shares stays float32.

Measured on the 2-core AMD EPYC (avx512, no AMX), Qwen2.5-Coder-0.5B, prefix 400 tokens: see
``docs/design.md`` (Cost-aware drafting). torchao's ``Int8DynamicActivationInt8WeightConfig`` and
``Int8WeightOnlyConfig`` were slower than bf16 in eager mode here; compiled with
``torch.compile`` they were fast but took minutes to compile on first use.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from talon.models.base import LoadedModel
from talon.models.gguf_blocks import GROUP, Int4Groups, Q4KSource
from talon.run_config import ConfigError
from talon.settings import DRAFT_QUANTS, INT8_REFUSED, TARGET_WEIGHTS

logger = logging.getLogger(__name__)
_HEAD_LOCK = threading.Lock()


def has_vnni() -> bool:
    """Does this CPU multiply int8 into int32 in one instruction (AVX512-VNNI or AVX-VNNI)? Without
    it, fbgemm sums pairs of u8 x s8 products in int16, which saturates on 8-bit activations."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


# 7-bit activations where the kernel would saturate on 8 (PyTorch's own fbgemm default): on an
# AVX2 host without VNNI, 8-bit activations put a third of a row's largest output in error
REDUCE_RANGE = not has_vnni()
LOUD = 4.0  # a row this many times its batch's median absolute peak is quantized on its own
LOUD_ROWS = 32  # in calls of at least this many rows (a prefill, an atlas's batches)


class Int8Linear(nn.Module):
    """y = x @ W.T + b with W held as packed int8 (one scale per output row), x float32."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()  # (out, in)
        scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-8).double()  # (out,)
        zeros = torch.zeros_like(scales, dtype=torch.long)
        with warnings.catch_warnings():  # quantized tensors are marked deprecated in torch 2.13
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(weight, scales, zeros, 0, torch.qint8)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()  # not a view of a mapped file
        self.packed = torch.ops.quantized.linear_prepack(qweight, bias)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, shape[-1]).float().contiguous()  # (T, in)
        return self.rows(rows).reshape(*shape[:-1], self.out_features)

    def rows(self, rows: torch.Tensor) -> torch.Tensor:
        """(T, in) -> (T, out). fbgemm quantizes a call's activations with one scale, the largest
        row's. In a prefill, a row ``LOUD`` times its batch's median (the first token's massive
        activations reach 100x in Qwen2.5) would leave the others a bit or two, so each such row
        goes alone. A tree step's few rows (under ``LOUD_ROWS``) keep one call: the check would
        cost it 10-20 %."""
        if rows.shape[0] >= LOUD_ROWS:
            peak = rows.abs().amax(dim=1)  # (T,)
            loud = peak > LOUD * peak.median()
            if bool(loud.any()):
                out = torch.empty(rows.shape[0], self.out_features, dtype=rows.dtype)
                quiet = ~loud
                if bool(quiet.any()):
                    out[quiet] = torch.ops.quantized.linear_dynamic(rows[quiet].contiguous(), self.packed, REDUCE_RANGE)
                for i in loud.nonzero().flatten().tolist():
                    out[i:i + 1] = torch.ops.quantized.linear_dynamic(rows[i:i + 1], self.packed, REDUCE_RANGE)
                return out
        return torch.ops.quantized.linear_dynamic(rows, self.packed, REDUCE_RANGE)


def int8_supported() -> bool:
    """fbgemm's int8 kernels are present (x86 CPU builds of torch)."""
    ops = torch.ops.quantized
    return "fbgemm" in torch.backends.quantized.supported_engines and all(
        hasattr(ops, op) for op in ("linear_prepack", "linear_dynamic")
    )


def resolve_draft_quant(quant: str, device: torch.device) -> str:
    """``auto``: int8 on a CPU with fbgemm (measured faster there), none elsewhere."""
    if quant not in DRAFT_QUANTS:
        raise ConfigError(f"draft quantization must be one of {DRAFT_QUANTS}, got {quant!r}")
    if quant == "auto":
        return "int8" if device.type == "cpu" and int8_supported() else "none"
    if quant == "int8" and (device.type != "cpu" or not int8_supported()):
        raise ConfigError("int8 draft quantization needs the CPU with fbgemm; use --draft-quant none")
    return quant


def quantize_draft(lm: LoadedModel) -> LoadedModel:
    """The draft with int8 decoder Linear layers, activations in float32 (a new LoadedModel)."""
    model = lm.model.float()
    replace_linears(model.get_decoder(), lambda _, linear: Int8Linear(linear))
    model.talon_quant = "int8"
    logger.info("draft %s: decoder Linear layers quantized to int8 (fbgemm)", lm.name)
    return LoadedModel(model, lm.tokenizer, lm.name, torch.float32, lm.device)


def replace_linears(root: nn.Module, make: Callable[[str, nn.Linear], nn.Module | None]) -> None:
    """Every ``nn.Linear`` under ``root`` replaced by ``make(its name under root, linear)``
    (None: kept as it is)."""
    for prefix, parent in list(root.named_modules()):
        for name, child in list(parent.named_children()):
            full = f"{prefix}.{name}" if prefix else name
            if isinstance(child, nn.Linear) and (packed := make(full, child)) is not None:
                setattr(parent, name, packed)


def int8_head(model: nn.Module, vocab_size: int) -> Int8Linear:
    """The int8 copy of ``model``'s LM head over its first ``vocab_size`` rows (0 = all), built
    once per size and kept on the model (``talon_heads``); safe to call from several runs."""
    heads = model.__dict__.setdefault("talon_heads", {})
    head = heads.get(vocab_size)
    if head is None:
        with _HEAD_LOCK:
            head = heads.get(vocab_size)
            if head is None:
                out = model.get_output_embeddings()
                rows = min(vocab_size or out.weight.shape[0], out.weight.shape[0])
                linear = nn.Linear(out.weight.shape[1], rows, bias=out.bias is not None)
                linear.weight = nn.Parameter(out.weight.detach()[:rows], requires_grad=False)
                if out.bias is not None:
                    linear.bias = nn.Parameter(out.bias.detach()[:rows], requires_grad=False)
                head = heads[vocab_size] = Int8Linear(linear)
    return head


# ---------------------------------------------------------------------------------------------
# The target at the precision it ships in: int8 / int4 weights, activations in the run's dtype
# ---------------------------------------------------------------------------------------------

INT4_GROUP = GROUP  # Q4_K's sub-block: 32 weights share one scale and one minimum


class PackedLinear(nn.Module):
    """y = x @ W.T + b for a target whose weights stay packed. ``bits=8``: int8 weights (a scale
    per output row) times int8 activations (a scale per input row, taken on the fly), summed
    exactly in int32 by ``torch._int_mm``; ``bits=4``: int4 weights (groups of ``INT4_GROUP`` along
    the input, a scale and a zero point each) times bf16 activations, by torch's
    ``_weight_int4pack_mm_for_cpu``. Either way a row's result does not depend on the rows beside
    it (integer sums are exact; the int4 kernel takes a row at a time), so a tree of 17 rows gives
    every row what decoding it alone would (tests/test_quant_target.py)."""

    def __init__(self, linear: nn.Linear, bits: int, dtype: torch.dtype = torch.bfloat16,
                 groups: Int4Groups | None = None, weight_only: bool = False) -> None:
        """``dtype``: the activations' (bf16 for speed; float32 in the tests of exactness).
        ``groups`` (int4 only): the shipped integers and group scales (a GGUF's Q4_K blocks);
        without them the weights are rounded to the nearest of 16 levels per group.
        ``weight_only`` (int8 only): activations stay as they are (``_weight_int8pack_mm``, a row
        at a time) instead of being rounded to int8: no rounding step for float noise to cross."""
        super().__init__()
        self.dtype = dtype
        weight = linear.weight.detach().float()  # (out, in)
        self.out_features, self.in_features = weight.shape
        self.bits = bits
        self.weight_only = weight_only
        if bits == 8:
            scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
            self.register_buffer("qweight", torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8))
            # float32 when applied after the exact int32 sum; the activations' dtype for the kernel
            self.register_buffer("scales", scales.to(dtype) if weight_only else scales)
        elif bits == 4:
            groups = groups if groups is not None else nearest_int4(weight)
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(groups.q, 2)
            self.register_buffer("qweight", packed)
            # w = q * scale + minimum = (q - 8) * scale + zero, zero = minimum + 8 * scale;
            # the kernel reads them laid out (in / group, out, 2)
            scale, zero = groups.scale, groups.minimum + 8 * groups.scale
            self.register_buffer("scales", torch.stack([scale.t(), zero.t()], dim=-1).contiguous().to(dtype))
        else:
            raise ConfigError(f"packed weights are 8 or 4 bits, got {bits}")
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        if self.bits == 8 and self.weight_only:
            rows = x.reshape(-1, self.in_features).to(self.dtype).contiguous()
            y = torch.ops.aten._weight_int8pack_mm(rows, self.qweight, self.scales)
        elif self.bits == 8:
            rows = x.reshape(-1, self.in_features).float()
            step = rows.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0  # (M, 1), per row
            q = torch.round(rows / step).clamp(-127, 127).to(torch.int8)
            y = (torch._int_mm(q, self.qweight.t()).float() * step * self.scales).to(self.dtype)
        else:
            rows = x.reshape(-1, self.in_features).to(self.dtype).contiguous()
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.qweight, INT4_GROUP, self.scales)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


def nearest_int4(weight: torch.Tensor) -> Int4Groups:
    """``weight`` (out, in) rounded to 16 evenly spaced levels per group, from its minimum to
    its maximum: for weights that do not come as Q4_K blocks."""
    out = weight.shape[0]
    groups = weight.reshape(out, -1, INT4_GROUP)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    step = ((high - low) / 15.0).clamp_min(1e-12)
    q = torch.round((groups - low[..., None]) / step[..., None]).clamp(0, 15).to(torch.int32)
    return Int4Groups(q.reshape(out, -1), step, low)


def is_packed(model: nn.Module) -> bool:
    """``model`` holds packed target weights (``quantize_target``)."""
    return any(isinstance(m, PackedLinear) for m in model.modules())


def packed_supported(bits: int) -> bool:
    """torch has the CPU kernel for ``bits``-bit packed weights."""
    if bits == 8:
        return hasattr(torch, "_int_mm")
    return all(hasattr(torch.ops.aten, name) for name in ("_weight_int4pack_mm_for_cpu",
                                                          "_convert_weight_to_int4pack_for_cpu", "_weight_int8pack_mm"))


def resolve_target_weights(weights: str, device: torch.device) -> str:
    """``auto``: dense. Measured on the embedded pair (docs/design.md, Target weights): int8 is the
    fastest but not lossless on a real model, and int4 speeds up plain decoding, not Talon's
    trees. ``int4`` needs the CPU, and ``int8`` is refused (ConfigError)."""
    if weights == "int8":
        raise ConfigError(INT8_REFUSED)
    if weights not in TARGET_WEIGHTS:
        raise ConfigError(f"target weights must be one of {TARGET_WEIGHTS}, got {weights!r}")
    if weights == "auto":
        return "dense"
    if weights == "int4" and (device.type != "cpu" or not packed_supported(4)):
        raise ConfigError("int4 target weights need the CPU with torch's packed int4 kernel; "
                          "use --target-weights dense")
    return weights


def quantize_target(lm: LoadedModel, weights: str, dtype: torch.dtype = torch.bfloat16,
                    blocks: Q4KSource | None = None) -> LoadedModel:
    """The target with every decoder Linear layer and its LM head as ``PackedLinear`` (from the
    weights as loaded, best in float32), everything else in ``dtype`` (a new LoadedModel). The
    result is the target: it decodes, verifies and ``generate``s with these weights.

    int4 with ``blocks`` (the GGUF the target was converted from): a layer shipped as Q4_K keeps
    its own integers and group scales; any other layer (Q6_K, say) is packed to weight-only int8
    from its dequantized weights, so no layer is rounded twice and no activation is rounded.
    Without ``blocks`` every layer is rounded to int4 groups (``nearest_int4``); a shape the int4
    kernel cannot take stays dense."""
    bits = {"int8": 8, "int4": 4}[weights]
    model = lm.model
    shipped = 0
    if bits == 8:  # kept for study (experiments/target_weights_check.py); not a user's choice
        logger.warning("int8 target weights: rounding each activation row to int8 turns float noise (a tree's rows "
                       "against one-token decoding) into different tokens on a real model; the output is not "
                       "guaranteed to be this model's own generate() (docs/design.md, Target weights)")

    def pack(name: str, linear: nn.Linear) -> PackedLinear | None:
        nonlocal shipped
        if bits == 4 and blocks is not None:
            groups = blocks.groups(name)
            if groups is None or linear.out_features % 16:  # not Q4_K, or rows the kernel cannot tile
                return PackedLinear(linear, 8, dtype, weight_only=True)
            shipped += 1
            return PackedLinear(linear, 4, dtype, groups)
        if bits == 4 and (linear.in_features % INT4_GROUP or linear.out_features % 16):
            return None  # the int4 kernel needs whole groups and 16 rows at a time: kept dense
        return PackedLinear(linear, bits, dtype)

    replace_linears(model, pack)  # a causal LM's Linear layers: the decoder's and the head
    model.config.tie_word_embeddings = False  # the head is its own packed copy now
    model.to(dtype)
    model.talon_quant = f"{weights}-weights" + ("-q4k" if shipped else "")
    source = f" ({shipped} layers from {blocks.path.name}'s Q4_K blocks, the rest weight-only int8)" if shipped else ""
    logger.info("target %s: decoder Linear layers and LM head packed to %s weights%s, %s activations", lm.name, weights,
                source, str(dtype).removeprefix("torch."))
    return LoadedModel(model, lm.tokenizer, lm.name, dtype, lm.device)
