"""An int8 draft model for the CPU: the decoder's Linear layers with int8 weights.

Only the draft is ever quantized: it changes which tokens are proposed (acceptance may move a
little), never which are accepted, so the output stays exactly the target's.

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

import torch
from torch import nn

from talon.models.base import LoadedModel
from talon.run_config import ConfigError
from talon.settings import DRAFT_QUANTS

log = logging.getLogger(__name__)
_HEAD_LOCK = threading.Lock()


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
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.packed = torch.ops.quantized.linear_prepack(qweight, bias)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch.ops.quantized.linear_dynamic(x.reshape(-1, shape[-1]).float().contiguous(), self.packed)
        return y.reshape(*shape[:-1], self.out_features)


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
    body = model.get_decoder()
    for name, module in list(body.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, Int8Linear(child))
    model.talon_quant = "int8"
    log.info("draft %s: decoder Linear layers quantized to int8 (fbgemm)", lm.name)
    return LoadedModel(model, lm.tokenizer, lm.name, torch.float32, lm.device)


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
