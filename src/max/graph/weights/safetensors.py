"""``SafetensorWeights``: one or many ``.safetensors`` files, memory-mapped.

The header of each file is read and checked here (dtype, shape, byte ranges
against the file size) so that a truncated or inconsistent file fails at
construction with the file and tensor named.  Tensor data are views of a
copy-on-write ``numpy.memmap`` of the file: nothing is read until used and
nothing is copied (a tensor whose offset is misaligned for its dtype is the
one exception: it is copied when first accessed).

``filepaths`` may also name a ``model.safetensors.index.json``: its shards
(resolved next to it) are loaded, and a shard it lists that is missing on
disk is an error.
"""

from __future__ import annotations

import json
import os
import struct
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, Set

import numpy as np
import torch

from max.dtype import DType
from max.graph.shape import Shape
from max.graph.type import DeviceRef
from max.graph.weight import Weight
from max.graph.weights.protocol import TensorInfo, WeightStore, _WeightsBase, progress

__all__ = ["SafetensorWeights"]

_ST_DTYPES: dict[str, DType] = {
    "BOOL": DType.bool,
    "U8": DType.uint8,
    "I8": DType.int8,
    "U16": DType.uint16,
    "I16": DType.int16,
    "U32": DType.uint32,
    "I32": DType.int32,
    "U64": DType.uint64,
    "I64": DType.int64,
    "F16": DType.float16,
    "BF16": DType.bfloat16,
    "F32": DType.float32,
    "F64": DType.float64,
    "F8_E4M3": DType.float8_e4m3fn,
    "F8_E5M2": DType.float8_e5m2,
}

_MAX_HEADER = 100 * 1024 * 1024


def _expand_paths(filepaths: Sequence[Any]) -> list[str]:
    """Shard paths, with any ``*.index.json`` replaced by the shards it lists."""
    out: list[str] = []
    for p in filepaths:
        p = os.fspath(p)
        if p.endswith(".json"):
            try:
                with open(p, encoding="utf-8") as f:
                    index = json.load(f)
            except FileNotFoundError:
                raise FileNotFoundError(f"safetensors index {p} does not exist") from None
            except (OSError, ValueError) as e:
                raise ValueError(f"safetensors index {p}: not a readable JSON index ({e})") from None
            wm = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(wm, dict):
                raise ValueError(f"safetensors index {p}: has no 'weight_map' object")
            base = os.path.dirname(p)
            shards = list(dict.fromkeys(wm.values()))
            missing = [s for s in shards if not os.path.exists(os.path.join(base, s))]
            if missing:
                raise FileNotFoundError(
                    f"safetensors index {p} lists shard(s) missing on disk: {missing} "
                    f"({sum(1 for v in wm.values() if v in missing)} tensors live there)"
                )
            out.extend(os.path.join(base, s) for s in shards)
        else:
            out.append(p)
    return list(dict.fromkeys(out))


class _SafetensorStore(WeightStore):
    format_name = "safetensors"

    def __init__(self, paths: list[str]) -> None:
        super().__init__()
        self.paths = paths
        self._files: dict[str, torch.Tensor] = {}  # path -> uint8 view of the whole file
        self._loc: dict[str, tuple[str, int, int]] = {}  # name -> (path, start, end) absolute byte offsets
        sizes = []
        for p in paths:
            if not os.path.exists(p):
                raise FileNotFoundError(f"safetensors file {p} does not exist")
            sizes.append(os.path.getsize(p))
        bar = progress(sum(sizes), "Loading safetensors", len(paths), unit="file")
        try:
            for p in paths:
                self._open(p)
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()

    def _open(self, path: str) -> None:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError(f"safetensors file {path} is truncated: {size} bytes, no header")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise ValueError(
                    f"safetensors file {path} is truncated or not safetensors: header says {n} bytes, "
                    f"file has {size - 8} after the length"
                )
            raw = f.read(n)
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise ValueError(f"safetensors file {path}: header is not valid JSON ({e})") from None
        if not isinstance(header, dict):
            raise ValueError(f"safetensors file {path}: header is not a JSON object")
        base = 8 + n
        infos: dict[str, TensorInfo] = {}
        locs: dict[str, tuple[str, int, int]] = {}
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            where = f"safetensors file {path}: tensor {name!r}"
            try:
                dts, shape, (s, e) = meta["dtype"], [int(d) for d in meta["shape"]], meta["data_offsets"]
                s, e = int(s), int(e)
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{where}: malformed header entry {meta!r}") from None
            dt = _ST_DTYPES.get(dts)
            if dt is None:
                raise ValueError(f"{where}: unsupported dtype {dts!r} (supported: {sorted(_ST_DTYPES)})")
            if any(d < 0 for d in shape):
                raise ValueError(f"{where}: negative dim in shape {shape}")
            want = int(np.prod(shape, dtype=np.int64)) * dt.size_in_bytes
            if e < s or e - s != want:
                raise ValueError(
                    f"{where}: byte range [{s}, {e}) holds {e - s} bytes but dtype {dt} x shape {shape} needs {want}"
                )
            if base + e > size:
                raise ValueError(
                    f"{where}: data ends at byte {base + e} but the file has {size} bytes (file truncated?)"
                )
            if name in self.infos:
                raise ValueError(f"{where}: duplicate tensor, also in {self.infos[name].file}")
            infos[name] = TensorInfo(name, dt, tuple(shape), path)
            locs[name] = (path, base + s, base + e)
        if size > 0:
            mm = np.memmap(path, dtype=np.uint8, mode="c")
            self._files[path] = torch.from_numpy(mm)
        self.infos.update(infos)
        self._loc.update(locs)

    def tensor(self, name: str) -> torch.Tensor:
        info = self.infos[name]
        path, s, e = self._loc[name]
        tdt = info.dtype.to_torch()
        if s == e:
            return torch.empty(info.shape, dtype=tdt)
        raw = self._files[path][s:e]
        item = info.dtype.size_in_bytes
        if s % item:
            raw = raw.clone()  # misaligned for this dtype: copy this one tensor
        return raw.view(tdt).reshape(info.shape)


class SafetensorWeights(_WeightsBase):
    """Weights from one or more ``.safetensors`` files (or a ``model.safetensors.index.json``)."""

    def __init__(self, filepaths: Sequence[os.PathLike[str] | str] | os.PathLike[str] | str, *,
                 tensors: Set[str] | None = None, tensors_to_file_idx: Mapping[str, int] | None = None,
                 prefix: str = "", allocated: dict[str, Any] | None = None,
                 _st_weight_map: dict[str, Any] | None = None, _st_file_handles: dict[Any, Any] | None = None) -> None:
        if isinstance(filepaths, (str, os.PathLike)):
            filepaths = [filepaths]
        paths = _expand_paths(list(filepaths))
        if not paths:
            raise ValueError("SafetensorWeights: no files given")
        store = _SafetensorStore(paths)
        if tensors is not None:
            unknown = set(tensors) - set(store.infos)
            if unknown:
                raise KeyError(f"SafetensorWeights: tensors not in the files: {sorted(unknown)[:5]}")
            store.infos = {k: v for k, v in store.infos.items() if k in tensors}
        self._init_base(store, prefix, allocated)

    @property
    def filepaths(self) -> list[Path]:
        return [Path(p) for p in self._store.paths]  # type: ignore[attr-defined]

    def allocate_as_bytes(self, dtype: DType | None = None) -> Weight:
        """A uint8 Weight holding this tensor's bytes (last dim scaled by the element size).

        ``dtype`` (optional) converts the values first.  A scalar becomes shape ``[itemsize]``.
        """
        info = self._info("allocate_as_bytes()")
        t = self._store.tensor(info.name)
        if dtype is not None:
            if not isinstance(dtype, DType):
                raise TypeError(f"allocate_as_bytes: dtype must be a DType, got {dtype!r}")
            if dtype != info.dtype:
                if not (dtype.is_float() and info.dtype.is_float()):
                    raise ValueError(
                        f"safetensors {info.file}: tensor {info.name!r} has dtype {info.dtype}; "
                        f"allocate_as_bytes({dtype}) only converts between float dtypes"
                    )
                t = t.to(dtype.to_torch())
        t = t.contiguous()
        if t.ndim == 0:
            t = t.reshape(1)
        b = t.view(torch.uint8)
        w = Weight(info.name, DType.uint8, list(b.shape), DeviceRef.CPU())
        self._allocated[info.name] = b
        return w


_ = (Iterable, Shape, warnings)
