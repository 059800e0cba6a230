"""A fast GGUF header reader (metadata and tensor index) over a memory map.

`gguf.GGUFReader` builds a numpy view per array element, which takes ~15 s for a
262k-token vocabulary; this reader walks the same layout with `struct` and bulk numpy
views and takes well under a second. Tensor payloads are still decoded by the `gguf`
package (`gguf.quants.dequantize`, `GGML_QUANT_SIZES`).

Layout (GGUF v2/v3, little-endian): magic "GGUF", u32 version, u64 tensor count,
u64 kv count; each kv = string key, u32 value type, value; each tensor info = string
name, u32 n_dims, u64 dims[n_dims] (innermost first), u32 ggml type, u64 offset; tensor
data starts at the next multiple of `general.alignment` (default 32).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_NUMPY = {
    0: np.uint8,
    1: np.int8,
    2: np.uint16,
    3: np.int16,
    4: np.uint32,
    5: np.int32,
    6: np.float32,
    7: np.bool_,
    10: np.uint64,
    11: np.int64,
    12: np.float64,
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # GGUF order: innermost (row length) first
    ggml_type: int
    offset: int  # absolute byte offset in the file


class GGUFHeader:
    """Metadata dict and tensor index of a GGUF file; `raw(info)` gives a tensor's bytes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.data = np.memmap(self.path, dtype=np.uint8, mode="r")
        self._buf = memoryview(self.data)  # type: ignore[arg-type]  # numpy stubs lack Buffer
        self._pos = 0
        if bytes(self._buf[:4]) != b"GGUF":
            raise ValueError(f"{self.path}: not a GGUF file (bad magic)")
        self._pos = 4
        version = self._scalar("<I")
        if version not in (2, 3):
            raise ValueError(
                f"{self.path}: unsupported GGUF version {version} (or big-endian file)"
            )
        n_tensors, n_kv = self._scalar("<Q"), self._scalar("<Q")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            self.metadata[key] = self._value(self._scalar("<I"))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._scalar("<I")
            dims = struct.unpack_from(f"<{n_dims}Q", self._buf, self._pos)
            self._pos += 8 * n_dims
            ggml_type, offset = self._scalar("<I"), self._scalar("<Q")
            infos.append((name, tuple(int(d) for d in dims), ggml_type, offset))
        align = int(self.metadata.get("general.alignment", 32))
        start = -(-self._pos // align) * align
        self.tensors = [TensorInfo(n, d, t, start + o) for n, d, t, o in infos]

    def _scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._scalar("<Q")
        text = bytes(self._buf[self._pos : self._pos + n]).decode("utf-8", errors="replace")
        self._pos += n
        return text

    def _value(self, kind: int) -> Any:
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            item, count = self._scalar("<I"), self._scalar("<Q")
            if item == _STRING:
                return [self._string() for _ in range(count)]
            if item in _NUMPY:
                width = np.dtype(_NUMPY[item]).itemsize
                values: np.ndarray = np.frombuffer(
                    self._buf, dtype=_NUMPY[item], count=count, offset=self._pos
                )
                self._pos += width * count
                return values.tolist()
            return [self._value(item) for _ in range(count)]
        if kind in _SCALARS:
            return self._scalar(_SCALARS[kind])
        raise ValueError(f"{self.path}: unknown GGUF value type {kind}")

    def raw(self, info: TensorInfo) -> np.ndarray:
        """The tensor's stored data, shaped the way `gguf.quants.dequantize` expects."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        qtype = GGMLQuantizationType(info.ggml_type)
        block, type_size = GGML_QUANT_SIZES[qtype]
        rows = tuple(reversed(info.dims[1:]))
        row_bytes = info.dims[0] // block * type_size
        nbytes = row_bytes * int(np.prod(rows, dtype=np.int64))
        data = self.data[info.offset : info.offset + nbytes]
        if qtype == GGMLQuantizationType.F32:
            return data.view(np.float32).reshape(*rows, info.dims[0])
        if qtype == GGMLQuantizationType.F16:
            return data.view(np.float16).reshape(*rows, info.dims[0])
        return data.reshape(*rows, row_bytes)
