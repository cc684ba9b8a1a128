"""A GGUF file's Q4_K blocks as the 4-bit integers and group scales torch's int4 kernel takes.

Q4_K (llama.cpp's k-quants) stores 256 weights in 144 bytes: ``d`` and ``dmin`` (float16), twelve
bytes holding eight 6-bit scales ``sc`` and eight 6-bit minimums ``m``, and 128 bytes of 4-bit
``q``. Sub-block ``s`` (32 weights) decodes as ``w = (d * sc[s]) * q - dmin * m[s]``: a scale and
a minimum per 32 weights, which is exactly the shape of ``_weight_int4pack_mm_for_cpu``'s groups
of 32 (``w = (q - 8) * scale + zero``). So a packed int4 target built from these blocks keeps the
shipped integers bit for bit; only the group's scale and zero are rounded to the activations'
dtype. The byte layout is llama.cpp's ``block_q4_K`` (ggml-common.h); the 6-bit unpacking is the
``gguf`` package's own ``Q4_K.get_scale_min``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import MODEL_ARCH_NAMES, GGMLQuantizationType, get_tensor_name_map
from gguf.quants import Q4_K

from talon.models.gguf_table import read_table

Q4K_BLOCK = 256  # weights per block
Q4K_BYTES = 144  # bytes per block: d, dmin (2 + 2), scales (12), q (128)
GROUP = 32  # weights per sub-block: one scale and one minimum


@dataclass(frozen=True)
class Int4Groups:
    """A weight matrix as ``w = q * scale + minimum`` per group of ``GROUP`` along the input."""

    q: torch.Tensor  # (out, in) int32, 0..15
    scale: torch.Tensor  # (out, in / GROUP) float32
    minimum: torch.Tensor  # (out, in / GROUP) float32

    def dequantize(self) -> torch.Tensor:
        out, n_in = self.q.shape
        groups = self.q.reshape(out, -1, GROUP).float() * self.scale[..., None] + self.minimum[..., None]
        return groups.reshape(out, n_in)


def q4k_groups(raw: np.ndarray, out: int, n_in: int) -> Int4Groups:
    """Decode a Q4_K tensor's bytes (``out`` rows of ``n_in`` weights) into integers and groups."""
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, Q4K_BYTES)
    d = blocks[:, 0:2].view(np.float16).astype(np.float32)  # (n, 1)
    dmin = blocks[:, 2:4].view(np.float16).astype(np.float32)
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16])  # (n, 8) each, 0..63
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32)  # byte j of chunk c: sub-block 2c (low), 2c+1 (high)
    q = ((qs >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F).reshape(-1, Q4K_BLOCK)
    scale = d * sc.astype(np.float32)
    minimum = -(dmin * m.astype(np.float32))
    return Int4Groups(
        torch.from_numpy(q.astype(np.int32)).reshape(out, n_in),
        torch.from_numpy(scale).reshape(out, n_in // GROUP),
        torch.from_numpy(minimum).reshape(out, n_in // GROUP),
    )


class Q4KSource:
    """The Q4_K tensors of one GGUF file, looked up by a Hugging Face module name
    (``model.layers.0.self_attn.q_proj``); decoded on demand, one tensor at a time."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        table = read_table(self.path)  # the tensor table, not the 150k-token vocabulary
        arch = table.architecture
        names = {name: arch_id for arch_id, name in MODEL_ARCH_NAMES.items()}
        if arch not in names:
            raise ValueError(f"{self.path.name}: architecture {arch!r} is not one gguf knows")
        layers = int(table.metadata[f"{arch}.block_count"])  # type: ignore[call-overload]
        self._names = get_tensor_name_map(names[arch], layers)
        self._tensors = table.tensors

    def groups(self, module_name: str) -> Int4Groups | None:
        """The blocks of ``module_name``'s weight, or None when that tensor is not Q4_K."""
        name = self._names.get_name(f"{module_name}.weight", try_suffixes=(".weight",))
        tensor = self._tensors.get(name or "")
        if tensor is None or tensor.tensor_type != GGMLQuantizationType.Q4_K:
            return None
        n_in, out = tensor.shape[:2]  # GGUF lists the fastest axis first
        return q4k_groups(tensor.data, out, n_in)

    def count(self) -> int:
        return sum(t.tensor_type == GGMLQuantizationType.Q4_K for t in self._tensors.values())
