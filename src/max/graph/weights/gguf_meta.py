"""Fast GGUF metadata reading (no tensor data is touched).

``read_gguf_metadata(path)`` parses the header, the key/value section and the tensor
infos of a GGUF file (versions 2 and 3) with ``struct`` over an ``mmap``.  Numeric
arrays come back as numpy arrays, string arrays as lists of ``str`` -- except long ones
(a vocabulary's tokens and merges): a :class:`GGUFStringArray` decodes them from the
file each time it is read, so the cached metadata does not keep 100k strings (~8 MB)
alive for the life of the process after the tokenizer is built.  On SmolLM2-135M
(49k tokens, 49k merges) this takes a few tens of milliseconds, against about a
second for ``gguf.GGUFReader``, which also builds memmaps for every tensor.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Iterator

import numpy as np

from max.graph.quantization.formats import FILE_TYPE_TO_GGML, GGML_TYPE_NAMES  # noqa: F401

GGUF_MAGIC = b"GGUF"

# GGUF value types.
_U8, _I8, _U16, _I16, _U32, _I32, _F32, _BOOL, _STR, _ARR, _U64, _I64, _F64 = range(13)
_SCALAR = {
    _U8: ("<B", 1), _I8: ("<b", 1), _U16: ("<H", 2), _I16: ("<h", 2), _U32: ("<I", 4), _I32: ("<i", 4),
    _F32: ("<f", 4), _BOOL: ("<?", 1), _U64: ("<Q", 8), _I64: ("<q", 8), _F64: ("<d", 8),
}
_NUMPY = {
    _U8: np.uint8, _I8: np.int8, _U16: np.uint16, _I16: np.int16, _U32: np.uint32, _I32: np.int32,
    _F32: np.float32, _BOOL: np.bool_, _U64: np.uint64, _I64: np.int64, _F64: np.float64,
}

# GGML tensor type names and llama.cpp file types: from the format table.


class GGUFFormatError(ValueError):
    """The file is not a readable GGUF file."""


@dataclass
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int

    @property
    def type_name(self) -> str:
        return GGML_TYPE_NAMES.get(self.ggml_type, f"type{self.ggml_type}")


@dataclass
class GGUFMetadata:
    """Header, key/values and tensor infos of one GGUF file."""

    path: str
    version: int
    fields: dict[str, Any]
    tensors: list[GGUFTensorInfo] = field(default_factory=list)
    data_offset: int = 0
    """Byte offset of the tensor data section (tensor offsets are relative to it)."""

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    @property
    def architecture(self) -> str | None:
        return self.fields.get("general.architecture")

    def arch_get(self, key: str, default: Any = None) -> Any:
        """``{architecture}.{key}``, e.g. ``arch_get("context_length")``."""
        return self.fields.get(f"{self.architecture}.{key}", default)

    def small_tensor(self, name: str) -> np.ndarray:
        """The values of the F32/F16 tensor ``name`` (small per-model tables such as ``rope_freqs``) as
        float64, numpy-shaped, read from this file.  KeyError if the file has no such tensor; GGUFFormatError
        for another element type or data beyond the end of the file."""
        info = next((t for t in self.tensors if t.name == name), None)
        if info is None:
            raise KeyError(f"{self.path}: no tensor {name!r}")
        dtype = {0: np.float32, 1: np.float16}.get(info.ggml_type)
        if dtype is None:
            raise GGUFFormatError(f"{self.path}: tensor {name!r} is {info.type_name}, expected F32 or F16")
        count = int(np.prod(info.shape, dtype=np.int64))
        start = self.data_offset + int(info.offset)
        if start + count * np.dtype(dtype).itemsize > os.path.getsize(self.path):
            raise GGUFFormatError(f"{self.path}: tensor {name!r} runs past the end of the file")
        data = np.fromfile(self.path, dtype=np.dtype(dtype).newbyteorder("<"), count=count, offset=start)
        return data.astype(np.float64).reshape(info.shape)

    @property
    def tensor_type_counts(self) -> Counter:
        return Counter(t.type_name for t in self.tensors)

    @property
    def primary_type(self) -> str | None:
        """The GGML type that describes the file: ``general.file_type`` when present, else
        the most common type among 2-D (matrix) tensors."""
        ft = self.fields.get("general.file_type")
        if ft is not None and int(ft) in FILE_TYPE_TO_GGML:
            return FILE_TYPE_TO_GGML[int(ft)]
        mats = Counter(t.type_name for t in self.tensors if len(t.shape) >= 2)
        if mats:
            return mats.most_common(1)[0][0]
        if self.tensors:
            return self.tensor_type_counts.most_common(1)[0][0]
        return None


LAZY_STRING_ARRAY_MIN = 1024
"""String arrays at least this long are read from the file when used (:class:`GGUFStringArray`)."""


def _decode_strings(buf: Any, pos: int, count: int, path: str) -> list[str]:
    end = len(buf)
    unpack = struct.unpack_from
    out = [None] * count
    for i in range(count):
        if pos + 8 > end:
            raise GGUFFormatError(f"{path}: truncated GGUF string array")
        n = unpack("<Q", buf, pos)[0]
        pos += 8
        if pos + n > end:
            raise GGUFFormatError(f"{path}: truncated GGUF string array")
        out[i] = str(buf[pos:pos + n], "utf-8", "replace")
        pos += n
    return out  # type: ignore[return-value]


class GGUFStringArray(Sequence):
    """A long GGUF string array (``tokenizer.ggml.tokens``, ``tokenizer.ggml.merges``) that stays in the file:
    its length is known, its strings are decoded from the file each time it is iterated, indexed or
    compared (:meth:`tolist` once, then use the list, for repeated access).  ValueError
    (:class:`GGUFFormatError`) if the file changed since its metadata was read."""

    __slots__ = ("path", "offset", "count", "stamp")

    def __init__(self, path: str, offset: int, count: int, stamp: tuple[int, int]) -> None:
        self.path, self.offset, self.count, self.stamp = path, offset, count, stamp

    def tolist(self) -> list[str]:
        st = os.stat(self.path)
        if (st.st_size, st.st_mtime_ns) != self.stamp:
            raise GGUFFormatError(f"{self.path}: the file changed since its metadata was read")
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _decode_strings(mm, self.offset, self.count, self.path)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[str]:
        return iter(self.tolist())

    def __getitem__(self, i: Any) -> Any:
        return self.tolist()[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GGUFStringArray):
            return (self.path, self.offset, self.count, self.stamp) == (other.path, other.offset, other.count,
                                                                       other.stamp) or self.tolist() == other.tolist()
        if isinstance(other, (list, tuple)):
            return len(other) == self.count and self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"GGUFStringArray({self.count} strings at offset {self.offset} of {self.path!r})"


class _Cursor:
    __slots__ = ("buf", "pos", "path", "stamp")

    def __init__(self, buf: Any, path: str, stamp: tuple[int, int] | None = None) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path
        self.stamp = stamp

    def need(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            raise GGUFFormatError(f"{self.path}: truncated GGUF file (needed {n} bytes at offset {self.pos})")

    def unpack(self, fmt: str, size: int) -> Any:
        self.need(size)
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += size
        return v

    def string(self) -> str:
        n = self.unpack("<Q", 8)
        self.need(n)
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype: int, keep_arrays: bool) -> Any:
        if vtype in _SCALAR:
            fmt, size = _SCALAR[vtype]
            return self.unpack(fmt, size)
        if vtype == _STR:
            return self.string()
        if vtype == _ARR:
            etype = self.unpack("<I", 4)
            count = self.unpack("<Q", 8)
            if etype in _NUMPY:
                size = _SCALAR[etype][1] * count
                self.need(size)
                arr = np.frombuffer(self.buf, dtype=_NUMPY[etype], count=count, offset=self.pos).copy()
                self.pos += size
                return arr
            if etype == _STR:
                return self._string_array(count)
            return [self.value(etype, keep_arrays) for _ in range(count)]
        raise GGUFFormatError(f"{self.path}: unknown GGUF value type {vtype} at offset {self.pos}")

    def _string_array(self, count: int) -> list[str] | GGUFStringArray:
        start = self.pos
        self._skip_strings(count)
        if self.stamp is None or count < LAZY_STRING_ARRAY_MIN:
            return _decode_strings(self.buf, start, count, self.path)
        return GGUFStringArray(self.path, start, count, self.stamp)

    def _skip_strings(self, count: int) -> None:
        """Move past ``count`` strings (checking their lengths against the file)."""
        buf, pos, unpack, end = self.buf, self.pos, struct.unpack_from, len(self.buf)
        for _ in range(count):
            if pos + 8 > end:
                raise GGUFFormatError(f"{self.path}: truncated GGUF string array")
            pos += 8 + unpack("<Q", buf, pos)[0]
            if pos > end:
                raise GGUFFormatError(f"{self.path}: truncated GGUF string array")
        self.pos = pos


def _parse(buf: Any, path: str, stamp: tuple[int, int] | None = None) -> GGUFMetadata:
    """``stamp``: the file's (size, mtime_ns), for string arrays left in the file (None: decode them all)."""
    cur = _Cursor(buf, path, stamp)
    if len(buf) < 4 or bytes(buf[:4]) != GGUF_MAGIC:
        raise GGUFFormatError(f"{path}: not a GGUF file (bad magic {bytes(buf[:4])!r})")
    cur.pos = 4
    version = cur.unpack("<I", 4)
    if version not in (2, 3):
        raise GGUFFormatError(f"{path}: unsupported GGUF version {version} (expected 2 or 3)")
    n_tensors = cur.unpack("<Q", 8)
    n_kv = cur.unpack("<Q", 8)
    fields: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.unpack("<I", 4)
        fields[key] = cur.value(vtype, True)
    tensors = []
    for _ in range(n_tensors):
        name = cur.string()
        nd = cur.unpack("<I", 4)
        dims = tuple(cur.unpack("<Q", 8) for _ in range(nd))
        ttype = cur.unpack("<I", 4)
        off = cur.unpack("<Q", 8)
        # GGUF stores dims fastest-first; report them numpy-style (slowest-first).
        tensors.append(GGUFTensorInfo(name, tuple(reversed(dims)), ttype, off))
    align = int(fields.get("general.alignment", 32) or 32)
    data_offset = -(-cur.pos // align) * align
    return GGUFMetadata(path=path, version=version, fields=fields, tensors=tensors, data_offset=data_offset)


def read_gguf_metadata(path: str | os.PathLike) -> GGUFMetadata:
    """Parse the metadata of the GGUF file at ``path`` (cached by path, size and mtime)."""
    p = os.path.abspath(os.fspath(path))
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise FileNotFoundError(f"GGUF file not found: {p}") from None
    return _read_cached(p, st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=16)
def _read_cached(path: str, size: int, mtime_ns: int) -> GGUFMetadata:
    if size == 0:
        raise GGUFFormatError(f"{path}: empty file, not a GGUF file")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        return _parse(mm, path, (size, mtime_ns))


def is_gguf_file(path: str | os.PathLike) -> bool:
    """True if ``path`` is a file that starts with the GGUF magic."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False
