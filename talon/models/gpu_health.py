"""A GPU that is there but cannot be used, said aloud.

``torch==2.13.0`` from PyPI on Linux is a CUDA 13.0 build. With an older NVIDIA driver,
``torch.cuda.is_available()`` is False: ``auto`` then picks the CPU, the GPU presets vanish and a
paid GPU Space quietly runs the small CPU pair. This module notices NVIDIA hardware that torch
does not use and says which driver and which CUDA build disagree.
"""

from __future__ import annotations

import glob
import re
import shutil
import subprocess
from pathlib import Path

import torch

DRIVER_FILE = Path("/proc/driver/nvidia/version")


def nvidia_visible() -> bool:
    """NVIDIA hardware is visible: a ``/dev/nvidiaN`` node or an ``nvidia-smi`` on the PATH."""
    return bool(glob.glob("/dev/nvidia[0-9]*")) or shutil.which("nvidia-smi") is not None


def driver_version() -> str | None:
    """The NVIDIA kernel driver's version (its /proc file, else nvidia-smi), or None."""
    try:
        found = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", DRIVER_FILE.read_text())
        if found:
            return found.group(1)
    except OSError:
        pass
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def unusable_gpu() -> str | None:
    """A sentence when NVIDIA hardware is visible but this torch cannot use it; None otherwise."""
    if not nvidia_visible() or torch.cuda.is_available():
        return None
    driver = driver_version() or "unknown"
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only"
    return (f"An NVIDIA GPU is present (driver {driver}), but this PyTorch (torch {torch.__version__}, "
            f"a {build} build) cannot use it, so the models run on the CPU. torch 2.13.0 from PyPI is a "
            "CUDA 13.0 build and needs driver 580 or newer; on an older driver install a torch build for "
            "the CUDA version the driver supports (see docs/gpu.md).")
