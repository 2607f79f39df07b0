"""``GGUFWeights``: tensors of a GGUF file.

A path is indexed with the fast metadata parser (``gguf_meta``) and one
copy-on-write memory map; a caller-supplied ``gguf.GGUFReader`` is used as is.

Shapes: GGUF stores dims innermost-first (``ReaderTensor.shape`` is
``[ne0, ne1, ...]``); here, as in the reference, a tensor's shape is the
row-major (numpy) order, i.e. the reverse.  Float/integer tensors keep their
dtype (F32, F16, BF16, F64, I8..I64).  Quantized tensors are raw ``uint8``
blocks of shape ``(*rows, bytes_per_row)`` carrying their
:class:`QuantizationEncoding`; ``TensorInfo.logical_shape`` keeps the element
shape.  Data are views of the copy-on-write memory map.

Every tensor's byte range is checked against the file size and the next
tensor's offset, so truncated files and type/shape/size disagreements fail at
construction, naming the file and tensor.
"""

from __future__ import annotations

import mmap as mmap_mod
import os
import warnings
import weakref
from typing import Any

import numpy as np
import torch

import gguf as _gguf

from max.dtype import DType
from max.graph.weights import mapped
from max.graph.quantization import QuantizationEncoding
from max.graph.weights.protocol import TensorInfo, WeightStore, _WeightsBase, progress

__all__ = ["GGUFWeights"]

_T = _gguf.GGMLQuantizationType
_PLAIN: dict[Any, DType] = {
    _T.F32: DType.float32,
    _T.F16: DType.float16,
    _T.BF16: DType.bfloat16,
    _T.F64: DType.float64,
    _T.I8: DType.int8,
    _T.I16: DType.int16,
    _T.I32: DType.int32,
    _T.I64: DType.int64,
}
_QUANT: dict[Any, QuantizationEncoding] = {
    _T[e._name_]: e for e in QuantizationEncoding if e.is_gguf and e._name_ in _T.__members__
}


class _GGUFStore(WeightStore):
    format_name = "GGUF"

    def __init__(self, source: Any) -> None:
        super().__init__()
        if not isinstance(source, _gguf.GGUFReader):
            self._init_fast(os.fspath(source))
            return
        # a caller-supplied GGUFReader: index its tensors (paths take the fast route above)
        reader = source
        path = os.fspath(getattr(reader.data, "filename", "") or "<GGUFReader>")
        self.path = path
        self._reader = reader
        self._mm = None
        self.raw_tensors: dict[str, Any] = {}
        self.unsupported: dict[str, str] = {}
        size = int(reader.data.shape[0])
        ordered = sorted(reader.tensors, key=lambda t: int(t.data_offset))
        bar = progress(size, "Indexing GGUF", len(ordered))
        infos: dict[str, TensorInfo] = {}
        try:
            for i, t in enumerate(ordered):
                where = f"GGUF file {path}: tensor {t.name!r}"
                end = int(t.data_offset) + int(t.n_bytes)
                if end > size:
                    raise ValueError(f"{where}: data ends at byte {end} but the file has {size} bytes (file truncated?)")
                if i + 1 < len(ordered) and end > int(ordered[i + 1].data_offset):
                    nxt = ordered[i + 1]
                    raise ValueError(
                        f"{where}: type {t.tensor_type.name} x shape {list(reversed(t.shape.tolist()))} needs "
                        f"{t.n_bytes} bytes, but tensor {nxt.name!r} starts "
                        f"{int(nxt.data_offset) - int(t.data_offset)} bytes after it"
                    )
                logical = tuple(int(d) for d in reversed(t.shape.tolist()))
                stored = tuple(int(d) for d in t.data.shape)
                qt = t.tensor_type
                if qt in _PLAIN:
                    dt, enc, logical_shape = _PLAIN[qt], None, None
                    stored = logical
                elif qt in _QUANT:
                    dt, enc, logical_shape = DType.uint8, _QUANT[qt], logical
                else:
                    dt, enc, logical_shape = DType.uint8, None, logical
                    self.unsupported[t.name] = qt.name
                infos[t.name] = TensorInfo(t.name, dt, stored, path, enc, logical_shape)
                self.raw_tensors[t.name] = t
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        # keep the file's tensor order
        self.infos = {t.name: infos[t.name] for t in reader.tensors}

    def _init_fast(self, path: str) -> None:
        """Index the file with the fast metadata parser and memory-map tensor data (no GGUFReader)."""
        from max.graph.weights.gguf_meta import GGUFFormatError, read_gguf_metadata

        if not os.path.exists(path):
            raise FileNotFoundError(f"GGUF file {path} does not exist")
        size = os.path.getsize(path)
        if size < 24:
            raise ValueError(f"GGUF file {path}: truncated ({size} bytes; the header alone is 24)")
        try:
            meta = read_gguf_metadata(path)
        except GGUFFormatError as e:
            raise ValueError(f"GGUF file {path}: {e}") from None
        self.path = path
        self.meta = meta
        self._reader = None
        self.raw_tensors = {}
        self.unsupported = {}
        before = mapped.file_identity(path)
        mm = np.memmap(path, dtype=np.uint8, mode="c")
        self._mm = mm
        # never written: repacking consumers may drop the pages they read, and key what they derive by the
        # file (see mapped.py) -- unless it changed while it was being mapped
        ident = mapped.file_identity(path)
        mapped.register(mm.ctypes.data, mm.nbytes, path, ident if ident == before else None)
        weakref.finalize(self, mapped.unregister, mm.ctypes.data)
        infos: dict[str, TensorInfo] = {}
        spans = []
        for t in meta.tensors:
            where = f"GGUF file {path}: tensor {t.name!r}"
            try:
                qt = _T(t.ggml_type)
            except ValueError:
                qt = None
            logical = tuple(int(d) for d in t.shape)
            n_el = int(np.prod(logical)) if logical else 1
            start = meta.data_offset + int(t.offset)
            if qt in _PLAIN:
                dt, enc = _PLAIN[qt], None
                nbytes = n_el * dt.size_in_bytes
                stored, logical_shape = logical, None
            elif qt in _QUANT:
                dt, enc = DType.uint8, _QUANT[qt]
                epb, bs = enc.elements_per_block, enc.block_size
                last = logical[-1] if logical else 1
                if last % epb:
                    raise ValueError(f"{where}: {qt.name} rows of {last} elements are not whole {epb}-element blocks")
                row_bytes = last // epb * bs
                stored = tuple(logical[:-1]) + (row_bytes,)
                nbytes = n_el // epb * bs
                logical_shape = logical
            else:
                name = qt.name if qt is not None else f"type{t.ggml_type}"
                bs_te = _gguf.GGML_QUANT_SIZES.get(qt) if qt is not None else None
                if bs_te is None:
                    raise ValueError(f"{where}: unknown GGML type {name}")
                epb, bs = bs_te
                nbytes = n_el // epb * bs
                dt, enc, logical_shape = DType.uint8, None, logical
                stored = (nbytes,)
                self.unsupported[t.name] = name
            if start + nbytes > size:
                raise ValueError(f"{where}: data ends at byte {start + nbytes} but the file has {size} bytes "
                                 "(file truncated?)")
            spans.append((start, start + nbytes, t.name, (qt.name if qt is not None else "?"),
                          logical))
            infos[t.name] = TensorInfo(t.name, dt, stored, path, enc, logical_shape)
            self.raw_tensors[t.name] = (start, nbytes)
        spans.sort()
        for (s0, e0, n0, ty0, sh0), (s1, _, n1, _, _) in zip(spans, spans[1:]):
            if e0 > s1:
                raise ValueError(f"GGUF file {path}: tensor {n0!r}: type {ty0} x shape {list(sh0)} needs "
                                 f"{e0 - s0} bytes, but tensor {n1!r} starts {s1 - s0} bytes after it "
                                 "(type/shape disagree with the data)")
        self.infos = infos

    @property
    def reader(self) -> Any:
        if getattr(self, "_reader", None) is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._reader = _gguf.GGUFReader(self.path, mode="c")
        return self._reader

    def tensor(self, name: str) -> torch.Tensor:
        info = self.infos[name]
        if getattr(self, "_mm", None) is not None and name not in self.unsupported:
            start, nbytes = self.raw_tensors[name]
            raw = self._mm[start:start + nbytes]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                t = torch.from_numpy(raw)
            tdt = info.dtype.to_torch()
            if tdt != torch.uint8:
                t = t.view(tdt)
            return t.reshape(info.shape)
        info = self.infos[name]
        if name in self.unsupported:
            raise ValueError(
                f"GGUF file {self.path}: tensor {name!r} has GGML type {self.unsupported[name]}, "
                f"which libremax cannot decode (supported: F32, F16, BF16, F64, I8-I64, "
                f"{', '.join(e._name_ for e in _QUANT.values())})"
            )
        arr = self.raw_tensors[name].data
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only map when a user passes an 'r' reader
            t = torch.from_numpy(np.ascontiguousarray(arr))
        if info.dtype == DType.bfloat16:
            t = t.reshape(-1).view(torch.bfloat16)
        return t.reshape(info.shape)

    def raw(self, name: str) -> Any:
        if getattr(self, "_mm", None) is not None:
            return next(t for t in self.reader.tensors if t.name == name)
        return self.raw_tensors[name]


class GGUFWeights(_WeightsBase):
    """Weights from a GGUF file (quantized tensors as raw uint8 blocks with their encoding)."""

    def __init__(self, source: Any, tensors: dict[str, Any] | None = None, prefix: str = "",
                 allocated: dict[str, Any] | None = None) -> None:
        store = _GGUFStore(source)
        if tensors is not None:
            keep = set(tensors)
            store.infos = {k: v for k, v in store.infos.items() if k in keep}
        self._init_base(store, prefix, allocated)

    @property
    def reader(self) -> Any:
        """The underlying ``gguf.GGUFReader`` (metadata fields live there)."""
        return self._store.reader  # type: ignore[attr-defined]

    def release_resident_pages(self) -> bool:
        """Drop this process's resident pages of the memory-mapped file (libremax extension).

        Once a model has repacked or copied what it needs, the pages it read stay mapped and count
        in the process's RSS although nothing reads them again; tensors still viewing the file
        (an embedding table read row by row, say) fault their pages back in on use.  Nothing is
        lost: the mapping is read-only and never written.  Returns whether pages were released.
        """
        mm = getattr(self._store, "_mm", None)
        raw = getattr(mm, "_mmap", None) if mm is not None else None
        if raw is None or not hasattr(raw, "madvise") or not hasattr(mmap_mod, "MADV_DONTNEED"):
            return False
        try:
            raw.madvise(mmap_mod.MADV_DONTNEED)
        except (OSError, ValueError):
            return False
        return True

    @property
    def metadata(self) -> dict[str, Any]:
        """The file's key/value metadata (fast path; no GGUFReader)."""
        meta = getattr(self._store, "meta", None)
        if meta is not None:
            return meta.fields
        return {f.name: f.contents() for f in self._store.reader.fields.values()}  # type: ignore[attr-defined]
