"""A fast reader for a GGUF file's metadata and tensor table.

``gguf.GGUFReader`` builds a numpy view for every element of every array, which
takes ~10 s for a 262k-token vocabulary. This reader walks the same header
with ``struct`` over an mmap, keeps numeric arrays only when they are small,
and uses the ``gguf`` package's own type tables for tensor sizes. Its output is
tested against ``GGUFReader`` on real and synthetic files.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

__all__ = ["GGUFHeader", "TensorInfo", "read_header"]

_MAGIC = b"GGUF"
_SCALARS: dict[int, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_KEEP_NUMERIC_ARRAY = 4096  # longer numeric arrays (scores, token types) are skipped


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    n_bytes: int

    @property
    def n_elements(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf = buf
        self.pos = 0

    def unpack(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        raw = self.buf[self.pos : self.pos + length]
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind == GGUFValueType.ARRAY:
            return self.array()
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise ValueError(f"unknown GGUF value type {kind} at byte {self.pos}")
        return self.unpack(fmt)

    def array(self) -> Any:
        kind, count = self.unpack("<I"), self.unpack("<Q")
        if kind in _SCALARS and count > _KEEP_NUMERIC_ARRAY:
            self.pos += struct.calcsize(_SCALARS[kind]) * count
            return _Skipped(count)
        return [self.value(kind) for _ in range(count)]


@dataclass(frozen=True, slots=True)
class _Skipped:
    """A long numeric array we did not keep; its length is still known."""

    length: int

    def __len__(self) -> int:
        return self.length


def _tensor_bytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    elements = 1
    for dim in shape:
        elements *= dim
    return elements * size // block


def read_header(path: Path) -> GGUFHeader:
    """Parse the metadata key-values and tensor infos of a GGUF file (little-endian)."""
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != _MAGIC:
            raise ValueError(f"{path} is not a GGUF file")
        cursor = _Cursor(buf)
        cursor.pos = 4
        version = cursor.unpack("<I")
        if not 1 <= version <= 3:
            raise ValueError(f"{path}: unsupported GGUF version {version}")
        n_tensors, n_kv = cursor.unpack("<Q"), cursor.unpack("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cursor.string()
            metadata[key] = cursor.value(cursor.unpack("<I"))
        tensors = []
        for _ in range(n_tensors):
            name = cursor.string()
            dims = tuple(cursor.unpack("<Q") for _ in range(cursor.unpack("<I")))
            ggml_type = cursor.unpack("<I")
            cursor.unpack("<Q")  # offset in the data section
            tensors.append(TensorInfo(name, dims, ggml_type, _tensor_bytes(ggml_type, dims)))
    return GGUFHeader(version, metadata, tuple(tensors))
