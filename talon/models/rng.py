"""Random draws that never mix devices.

PyTorch refuses a CPU generator for a CUDA tensor (and the other way round), and a CPU-only test
suite never sees it. So every generator is made here, on the device of the tensors it will
sample, and every draw checks that the two still agree before torch is called: a mismatch is a
``DeviceMismatch`` naming both devices, on any machine, not a CUDA-only failure at a run's first
sampled step.
"""

from __future__ import annotations

import torch


class DeviceMismatch(RuntimeError):
    """A generator asked to sample a tensor that lives on another device."""


def same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` are one device; the CPU has no index."""
    return a.type == b.type and (a.index or 0) == (b.index or 0)


def generator_for(device: torch.device | str, seed: int) -> torch.Generator:
    """A seeded generator on ``device``: make it with the device of the tensors it will sample."""
    return torch.Generator(device=torch.device(device)).manual_seed(seed)


def check_device(generator: torch.Generator, tensor: torch.Tensor) -> None:
    if not same_device(generator.device, tensor.device):
        raise DeviceMismatch(
            f"a generator on {generator.device} cannot sample a tensor on {tensor.device}: "
            "make it with talon.models.rng.generator_for(tensor.device, seed)"
        )


def uniform(generator: torch.Generator, like: torch.Tensor) -> float:
    """One float64 draw in [0, 1) from ``generator``, on the device of ``like``."""
    check_device(generator, like)
    return torch.rand((), generator=generator, dtype=torch.float64, device=like.device).item()


def categorical(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token id drawn from the (V,) distribution ``probs``."""
    check_device(generator, probs)
    return int(torch.multinomial(probs, 1, generator=generator))
