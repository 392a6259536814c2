"""Reads a GGUF file's header: its metadata and the name, shape and type of every tensor.

The importer decodes the tensor data itself (compiler/gguf/quants.py): `mx.load` would
silently widen K-quants and BF16 to float16. The header gives each tensor's type, shape
and offset; `tensor_bytes` maps a tensor's bytes without reading them, and `read_header`
checks that the file holds all the tensor data, so a cut download is named as such.
"""

from __future__ import annotations

import struct
from pathlib import Path

import attrs
import numpy as np

from .quants import BLOCKS

MAGIC = b"GGUF"

# ggml_type ids (ggml.h) -> names; only what is needed to name a type in a message.
GGML_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K",
    16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S",
    22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
    29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}

# GGUF metadata value types -> struct formats (strings and arrays are handled apart).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """A GGUF file graphc cannot import: the message names what and how to proceed."""


@attrs.frozen
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (outermost first), as mx.load returns it
    type_id: int
    offset: int = 0  # from the start of the data section

    @property
    def n_values(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def n_bytes(self) -> int | None:
        """Bytes in the file, or None for a type graphc has no block layout for."""
        if self.type_name not in BLOCKS:
            return None
        n, size = BLOCKS[self.type_name]
        return self.n_values // n * size

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.type_id, f"type {self.type_id}")


@attrs.frozen
class GGUFHeader:
    version: int
    metadata: dict
    tensors: tuple[TensorInfo, ...]
    data_start: int = 0  # byte offset of the data section in the file


def tensor_bytes(path: str | Path, header: GGUFHeader, t: TensorInfo) -> np.ndarray:
    """The stored bytes of `t` (a read-only memory map: nothing is read until used)."""
    return np.memmap(path, dtype=np.uint8, mode="r", offset=header.data_start + t.offset, shape=(t.n_bytes,))


class _Reader:
    def __init__(self, f, path):
        self.f, self.path = f, path

    def read(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise GGUFError(f"{self.path}: the file ends inside its header (truncated download?)")
        return b

    def scalar(self, fmt: str):
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.read(self.scalar("<Q")).decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, n = self.scalar("<I"), self.scalar("<Q")
            if etype in _SCALARS:  # one read for numeric arrays (token types, scores)
                fmt = _SCALARS[etype]
                size = struct.calcsize(fmt)
                return list(struct.unpack(f"<{n}{fmt[1]}", self.read(n * size)))
            return [self.value(etype) for _ in range(n)]
        raise GGUFError(f"{self.path}: unknown metadata value type {vtype}; is this a GGUF file?")


def read_header(path: str | Path) -> GGUFHeader:
    path = Path(path)
    with open(path, "rb") as f:
        r = _Reader(f, path)
        if r.read(4) != MAGIC:
            raise GGUFError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
        version = r.scalar("<I")
        if version not in (2, 3):
            raise GGUFError(f"{path}: GGUF version {version} is not supported (versions 2 and 3 are)")
        n_tensors, n_kv = r.scalar("<Q"), r.scalar("<Q")
        metadata = {}
        for _ in range(n_kv):
            key = r.string()
            metadata[key] = r.value(r.scalar("<I"))
        tensors = []
        for _ in range(n_tensors):
            name = r.string()
            ndim = r.scalar("<I")
            dims = [r.scalar("<Q") for _ in range(ndim)]
            type_id = r.scalar("<I")
            offset = r.scalar("<Q")
            tensors.append(TensorInfo(name, tuple(reversed(dims)), type_id, offset))
        align = int(metadata.get("general.alignment", 32))
        data_start = -(-f.tell() // align) * align
    header = GGUFHeader(version, metadata, tuple(tensors), data_start)
    _check_complete(path, header)
    return header


def _check_complete(path: Path, header: GGUFHeader) -> None:
    size = path.stat().st_size
    ends = [header.data_start + t.offset + t.n_bytes for t in header.tensors if t.n_bytes is not None]
    if ends and max(ends) > size:
        raise GGUFError(f"{path}: the file ends inside its tensor data ({size} of {max(ends)} bytes; "
                        "truncated download?); download it again")
