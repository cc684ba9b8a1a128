"""Hugging Face ZeroGPU, by its contract.

On a ZeroGPU Space the ``spaces`` package patches torch in the server process: weights moved to
``cuda`` on the main thread before ``launch()`` are recorded (not really moved), and real CUDA
work happens only inside a ``@spaces.GPU`` call, which runs in a forked worker process with the
GPU attached. So on ZeroGPU Talon

* loads the start-up pair on the main thread at start (``app.py``), never in a thread;
* makes every other CUDA touch (another preset's load, the memory check, the cost probe, every
  decode) inside one ``@spaces.GPU`` call per user action, reserved for a duration computed from
  the request (``talon.server.device``);
* hands back what a call learned (step traces, cost curves) as plain data, because changes made
  to Python state in the worker do not come back.

ZeroGPU supports only some Python and torch versions (its documentation, August 2026: Python
3.10 and 3.12, torch 2.8 to 2.11). On any other stack the app refuses to start in ZeroGPU mode
with a message naming what is wrong, rather than fail on a visitor's first run.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

SUPPORTED_PYTHON = ((3, 10), (3, 12))
SUPPORTED_TORCH = ((2, 8), (2, 11))  # first and last minor version, both included
SPACE_PYTHON = "3.12"  # what scripts/zerogpu_space.py writes into a ZeroGPU Space
SPACE_TORCH = "2.11.0"


class ZeroGPUUnsupported(RuntimeError):
    """ZeroGPU was detected on a stack it does not support; the message says what to change."""


def spaces_module() -> Any | None:
    """The ``spaces`` package, or None where it is not installed (everywhere but Spaces and tests)."""
    try:
        return importlib.import_module("spaces")
    except ImportError:
        return None


def active() -> bool:
    """Running on ZeroGPU: ``spaces`` is importable and says so (SPACES_ZERO_GPU)."""
    spaces = spaces_module()
    if spaces is None:
        return False
    config = getattr(importlib.import_module("spaces.config"), "Config", None)
    return bool(getattr(config, "zero_gpu", False))


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def unmet_requirements(python: tuple[int, int] | None = None, torch_version: str | None = None) -> list[str]:
    """What in this stack ZeroGPU does not support (empty: all of it is supported)."""
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    python = python or (sys.version_info.major, sys.version_info.minor)
    problems = []
    if python not in SUPPORTED_PYTHON:
        names = " or ".join(f"{a}.{b}" for a, b in SUPPORTED_PYTHON)
        problems.append(f"Python {python[0]}.{python[1]} (ZeroGPU supports {names}: set python_version "
                        f'"{SPACE_PYTHON}" in the README front matter)')
    low, high = SUPPORTED_TORCH
    if not low <= _minor(torch_version) <= high:
        problems.append(f"torch {torch_version} (ZeroGPU supports {low[0]}.{low[1]} to {high[0]}.{high[1]}: "
                        f"pin torch=={SPACE_TORCH} in requirements.txt)")
    return problems


def check_supported(allow_unsupported: bool = False) -> list[str]:
    """Raise ZeroGPUUnsupported on an unsupported stack, unless ``allow_unsupported``
    (TALON_ZEROGPU_UNSUPPORTED_OK=1: then the problems are returned for a warning).
    ``scripts/zerogpu_space.py`` writes a Space whose stack passes."""
    problems = unmet_requirements()
    if problems and not allow_unsupported:
        raise ZeroGPUUnsupported(
            "ZeroGPU was detected (SPACES_ZERO_GPU), but it does not support " + " and ".join(problems)
            + ". Build the Space with `python -m scripts.zerogpu_space OUT_DIR`, which sets both, or "
            "pick a dedicated GPU in the Space's hardware settings (no ZeroGPU needed)."
        )
    return problems


def gpu(duration: Callable[..., int]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``spaces.GPU(duration=duration)`` where ``spaces`` is importable: on ZeroGPU each call
    reserves a GPU for the seconds ``duration`` computes from the call's own arguments; elsewhere
    ``spaces.GPU`` returns the function unchanged. Without ``spaces``, the function itself."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        DECORATED[f"{fn.__module__}.{fn.__qualname__}"] = (fn, duration)
        spaces = spaces_module()
        return fn if spaces is None else spaces.GPU(duration=duration)(fn)

    return decorate


# every function that runs on the GPU, by name: (the function itself, its duration), so a test can
# put each behind a fake ZeroGPU and prove that nothing else touches the device
DECORATED: dict[str, tuple[Callable[..., Any], Callable[..., int]]] = {}


def waiting_note(seconds: int) -> str:
    """What a visitor reads while a ZeroGPU call is queued."""
    return (f"waiting for a GPU slot (ZeroGPU: this Space shares GPUs; the run reserves up to {seconds} s "
            "of your daily GPU quota)…")
