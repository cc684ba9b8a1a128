"""A GGUF file's tensor table and scalar metadata, read without its vocabulary.

``gguf.GGUFReader`` builds a field object for every metadata value, the 150k-entry vocabulary and
merge table included, element by element: 7 s on a 2-core AMD EPYC, for a file whose tensors are
all Talon wants from it when it packs the target's Q4_K blocks. This reader walks past string
arrays by their lengths and keeps the scalars and the tensor table (name, ggml type, dimensions,
the bytes as a read-only memory map): a few milliseconds. The layout is the GGUF specification's
(ggml's ``docs/gguf.md``), versions 2 and 3, little-endian.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32
UNQUANTIZED = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}


@dataclass(frozen=True)
class TableTensor:
    """One tensor: ``shape`` in GGUF's order (the fastest axis first), ``data`` its bytes as
    ``GGUFReader`` shapes them (rows of blocks for a quantized type, values for F32/F16)."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray


@dataclass(frozen=True)
class GgufTable:
    metadata: dict[str, object]  # scalars and strings; an array of strings is kept as its length
    tensors: dict[str, TableTensor]

    @property
    def architecture(self) -> str:
        return str(self.metadata["general.architecture"])


class _Cursor:
    def __init__(self, blob: np.ndarray) -> None:
        self.blob, self.pos = blob, 0

    def take(self, fmt: str) -> tuple:
        values = struct.unpack_from(fmt, self.blob, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def string(self) -> str:
        (length,) = self.take("<Q")
        self.pos += length
        return bytes(self.blob[self.pos - length : self.pos]).decode("utf-8")

    def value(self, kind: int) -> object:
        if kind in SCALARS:
            return self.take(SCALARS[kind])[0]
        if kind == STRING:
            return self.string()
        if kind != ARRAY:
            raise ValueError(f"GGUF metadata value of unknown type {kind}")
        element, count = self.take("<IQ")
        if element in SCALARS:
            return list(self.take(f"<{count}{SCALARS[element][1]}"))
        if element != STRING:
            return [self.value(element) for _ in range(count)]  # nested arrays: rare and small
        for _ in range(count):  # a vocabulary or merge table: walked, not read
            (length,) = self.take("<Q")
            self.pos += length
        return count


def read_table(path: str | Path) -> GgufTable:
    """The metadata (string arrays as their lengths) and tensor table of the GGUF file at ``path``."""
    blob = np.memmap(path, mode="r", dtype=np.uint8)
    cursor = _Cursor(blob)
    if bytes(blob[:4]) != b"GGUF":
        raise ValueError(f"{Path(path).name} is not a GGUF file")
    _, version, n_tensors, n_values = cursor.take("<4sIQQ")
    if version not in (2, 3):
        raise ValueError(f"{Path(path).name} is GGUF version {version}; versions 2 and 3 are read")
    metadata: dict[str, object] = {}
    for _ in range(n_values):
        key = cursor.string()
        (kind,) = cursor.take("<I")
        metadata[key] = cursor.value(kind)
    entries = []
    for _ in range(n_tensors):
        name = cursor.string()
        (n_dims,) = cursor.take("<I")
        dims = cursor.take(f"<{n_dims}Q")
        kind, offset = cursor.take("<IQ")
        entries.append((name, GGMLQuantizationType(kind), tuple(int(d) for d in dims), offset))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))  # type: ignore[arg-type]
    start = -(-cursor.pos // alignment) * alignment
    tensors = {}
    for name, kind, dims, offset in entries:
        block, block_bytes = GGML_QUANT_SIZES[kind]
        rows = tuple(reversed(dims))  # numpy's order: the slowest axis first
        shape = rows[:-1] + (rows[-1] // block * block_bytes,) if kind not in UNQUANTIZED else rows
        dtype = UNQUANTIZED.get(kind, np.uint8)
        count = prod(shape)
        begin = start + offset
        data = blob[begin : begin + count * np.dtype(dtype).itemsize].view(dtype).reshape(shape)
        tensors[name] = TableTensor(name, kind, dims, data)
    return GgufTable(metadata, tensors)
