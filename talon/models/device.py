"""Where and in what precision a model runs: ``resolve_device`` and ``resolve_dtype`` (with the
CPU check of whether bfloat16 is faster than float32 here, decided once per host and kept)."""

from __future__ import annotations

import functools
import logging
import statistics
import time

import torch

from talon.models.base import ModelLoadError
from talon.models.rng import generator_for
from talon.models.verdict import VERDICT_ROUNDS, HostVerdict, RowsRule, Times, cpu_model, host_key, kept_verdict

logger = logging.getLogger(__name__)

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` -> CUDA if available, else CPU. Asking for an unavailable device is an error."""
    name = device.strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(name)
    except RuntimeError:
        raise ModelLoadError(f"Unknown device {device!r}: use auto, cpu, cuda or cuda:N.") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(
            f"Device {device!r} was asked for, but this PyTorch build sees no CUDA GPU. "
            "Use device 'auto' or 'cpu' (TALON_DEVICE), or install a CUDA build of PyTorch."
        )
    if resolved.type == "cuda" and (resolved.index or 0) >= torch.cuda.device_count():
        raise ModelLoadError(
            f"Device {device!r} does not exist: {torch.cuda.device_count()} CUDA GPU(s) found."
        )
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(f"Device {device!r} is not available on this machine; use 'auto' or 'cpu'.")
    if resolved.type not in ("cpu", "cuda", "mps"):
        raise ModelLoadError(f"Unsupported device {device!r}: use auto, cpu, cuda or cuda:N.")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` -> bfloat16 on CUDA; on CPU bfloat16 only where it measures faster, else float32."""
    name = dtype.strip().lower()
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16
        if device.type == "cpu" and _cpu_prefers_bf16():
            return torch.bfloat16
        return torch.float32
    if name not in TORCH_DTYPES:
        raise ModelLoadError(f"Unknown dtype {dtype!r}: use one of auto, {', '.join(TORCH_DTYPES)}.")
    if name == "float16" and device.type == "cpu":
        logger.warning(
            "float16 on CPU is slow and poorly supported; bfloat16 or float32 is usually better."
        )
    return TORCH_DTYPES[name]


def time_linear(dtype: torch.dtype, rows: int = 8, dim: int = 4096, reps: int = 6) -> float:
    """Median seconds of one (rows x dim) @ (dim x dim) linear in ``dtype`` on the CPU.

    The weight (64 MB in float32) is larger than the CPU caches, as a decoder's weights are:
    decoding a few tokens is bound by memory traffic, which bfloat16 halves where the CPU has
    native bf16 kernels. A cache-resident weight would time the arithmetic only."""
    generator = generator_for("cpu", 0)  # this timing runs on the CPU only
    x = torch.randn(rows, dim, generator=generator).to(dtype)  # (rows, dim)
    weight = torch.randn(dim, dim, generator=generator).to(dtype)  # (dim, dim)
    times: list[float] = []
    with torch.inference_mode():
        for i in range(reps + 2):
            start = time.perf_counter()
            torch.nn.functional.linear(x, weight)
            if i >= 2:  # the first calls warm up kernels and caches
                times.append(time.perf_counter() - start)
    return statistics.median(times)


def hardware_name(device: torch.device) -> str:
    """What runs the models: the GPU's name on CUDA, else the CPU's model name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


# the rows a decoder's linears see: one token (decoding, drafting) and a tree verification. On a
# 2-core Xeon with avx512 but no avx512_bf16, bf16 ran 1.2x float32 at 1 row and 0.5x at 16 (a
# 16-node verification of the embedded target 1,285 against 779 ms): a check at 8 rows alone once
# chose bf16 there, from one noisy float32 round, and made the app 4x slower. On a 2-core Xeon with
# AMX, bf16 ran 4.2-5.0x at 16 rows but only 1.06-1.29x at 1 row (a memory-bound product), so a
# rule that asked 1.15x at 1 row too chose float32 in one start of two, and the embedded pair then
# decoded 1.7x (plain) to 2.6x (hybrid) slower than in bf16 (docs/runs/2026-12-02-cpu-dtype-verdict.md)
BF16_RULE = RowsRule(tree_speedup=1.15, row_slowdown=1.10)  # (float32, bfloat16) seconds at 1 and 16 rows


def bf16_pays(times: Times) -> bool:
    """bfloat16 pays on these (float32, bfloat16) seconds by rows: clearly faster for a tree's
    rows, and not slower for one token."""
    return BF16_RULE.pays(times)


@functools.cache
def _cpu_prefers_bf16() -> bool:
    """Whether bfloat16 linears beat float32 ones here, both for one token and for a tree
    verification's rows: decided once per host and kept in ``TALON_COST_CACHE/dtype`` with its figures
    (``talon.models.verdict``), so every start on a host loads the models alike."""
    rule = f"bf16 >= {BF16_RULE.tree_speedup}x at {BF16_RULE.rows[1]} rows, <= {BF16_RULE.row_slowdown}x slower at 1"
    return kept_verdict("dtype", {**host_key(), "rule": rule}, check_dtype, logger, "dtype auto = %s")


def check_dtype() -> HostVerdict:
    """The dtype check: ``VERDICT_ROUNDS`` rounds, each timing both dtypes in turn at every size
    (a burst of load from elsewhere hits both); bfloat16 only where every round says it pays, and
    rounds that disagree are inside the noise, which means float32. Logged with its figures."""
    rounds = [{rows: (time_linear(torch.float32, rows), time_linear(torch.bfloat16, rows))
               for rows in BF16_RULE.rows} for _ in range(VERDICT_ROUNDS)]
    return BF16_RULE.judge(rounds, "CPU dtype check, (rows x 4096)@(4096x4096) linear, float32 / bfloat16", logger,
                           ("dtype auto = float32", "dtype auto = bfloat16"))
