"""Reads a GGUF file's header: its metadata and the name, shape and type of every tensor.

`mx.load` reads the tensor data (and already lays Q4_0/Q4_1/Q8_0 out as MLX's affine
quantization), but it silently dequantizes types it has no quantized layout for (K-quants
become float16, BF16 becomes float16). The importer needs the stored types to refuse
those by name, so the header is parsed here; it is small (no tensor data is read).
"""

from __future__ import annotations

import struct
from pathlib import Path

import attrs

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

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.type_id, f"type {self.type_id}")


@attrs.frozen
class GGUFHeader:
    version: int
    metadata: dict
    tensors: tuple[TensorInfo, ...]


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
            r.scalar("<Q")  # data offset: mx.load reads the data
            tensors.append(TensorInfo(name, tuple(reversed(dims)), type_id))
    return GGUFHeader(version, metadata, tuple(tensors))
