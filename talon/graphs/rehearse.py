"""What a CUDA graph's capture refuses, caught on the CPU: a rehearsed capture (``talon.graphs.chain``
runs its updates' warm-ups without a GPU) runs under ``HostScalarGuard``."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class HostScalarGuard(TorchDispatchMode):
    """Fails a rehearsed capture (on the CPU) where a Python value becomes a tensor: on CUDA,
    ``buf[index] = 3`` makes a host scalar that the write then copies to the device, and a copy from
    pageable host memory is refused while a graph is captured (as is ``torch.tensor(...)``). Write
    scalars with ``fill_`` / ``index_fill_`` instead."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func is torch.ops.aten.lift_fresh.default:
            raise RuntimeError("a captured update makes a tensor of a host value (an item assignment of a "
                               "Python number, or torch.tensor): on CUDA that is a copy from the host, "
                               "refused during capture; use fill_ / index_fill_")
        return func(*args, **(kwargs or {}))
