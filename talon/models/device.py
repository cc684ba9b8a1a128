"""Where and in what precision a model runs: ``resolve_device`` and ``resolve_dtype`` (with the
one-off CPU check of whether bfloat16 is faster than float32 here)."""

from __future__ import annotations

import contextlib
import functools
import logging
import platform
import statistics
import time
from pathlib import Path

import torch

from talon.models.base import ModelLoadError
from talon.models.rng import generator_for

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


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def hardware_name(device: torch.device) -> str:
    """What runs the models: the GPU's name on CUDA, else the CPU's model name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def bf16_pays(fp32_s: float, bf16_s: float, min_speedup: float = 1.15) -> bool:
    """Whether bfloat16 is clearly faster than float32, from the best timing of each."""
    return fp32_s / bf16_s >= min_speedup


# the rows a decoder's linears see: one token (decoding, drafting) and a tree verification. On a
# 2-core Xeon with avx512 but no avx512_bf16, bf16 ran 0.97x float32 at 1 row, 0.96x at 8 and
# 0.58x at 16 (a 16-node verification of the embedded target 1,285 against 779 ms): a check at 8
# rows alone once chose bf16 there, from one noisy float32 round, and made the app 4x slower
DTYPE_CHECK_ROWS = (1, 16)


@functools.cache
def _cpu_prefers_bf16(min_speedup: float = 1.15) -> bool:
    """Measure once per process whether bfloat16 linears are clearly faster than float32 here,
    both for one token and for a tree verification's rows (``DTYPE_CHECK_ROWS``).

    The two dtypes are timed in alternating rounds and the best round of each is kept, so a
    burst of load from other processes does not decide the comparison.
    """
    speedups = {}
    for rows in DTYPE_CHECK_ROWS:
        timed = [(time_linear(torch.float32, rows), time_linear(torch.bfloat16, rows)) for _ in range(3)]
        fp32_s, bf16_s = min(r[0] for r in timed), min(r[1] for r in timed)
        speedups[rows] = (fp32_s, bf16_s)
    prefers = all(bf16_pays(f, b, min_speedup) for f, b in speedups.values())
    logger.info(
        "CPU dtype check, (rows x 4096)@(4096x4096) linear, float32 / bfloat16: %s (need %.2fx at every size) "
        "-> dtype auto = %s",
        ", ".join(f"{rows} rows {1e3 * f:.2f} / {1e3 * b:.2f} ms ({f / b:.2f}x)" for rows, (f, b) in speedups.items()),
        min_speedup,
        "bfloat16" if prefers else "float32",
    )
    return prefers
