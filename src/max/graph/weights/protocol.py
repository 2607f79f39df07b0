"""The ``Weights`` protocol and the navigation/allocation logic every loader shares.

A loader (safetensors, GGUF, PyTorch) provides a *store*: the ordered tensor
names of a checkpoint, each tensor's stored dtype/shape/encoding and file,
and a zero-copy torch view of its data.  ``_WeightsBase`` adds hierarchical
names (``weights.model.layers[0].self_attn.q_proj.weight``), ``exists``,
``items``, ``data``, ``allocate`` (validated against the file) and the
``allocated_weights`` registry passed to ``InferenceSession.load``.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Protocol, TypeVar, runtime_checkable

import torch

from max.dtype import DType
from max.graph.dim import Dim, StaticDim
from max.graph.quantization import QuantizationEncoding
from max.graph.shape import Shape
from max.graph.type import DeviceRef
from max.graph.weight import Weight
from max.graph.weights.weight_data import WeightData

__all__ = ["Weights", "TensorInfo", "WeightStore", "PROGRESS_THRESHOLD_BYTES"]

_Self = TypeVar("_Self")

# Show a progress bar when a checkpoint is larger than this.
PROGRESS_THRESHOLD_BYTES = 300 * 1024 * 1024


@runtime_checkable
class Weights(Protocol):
    """Hierarchical access to a checkpoint's tensors (attribute and index navigation)."""

    @property
    def name(self) -> str: ...

    def __getitem__(self: _Self, idx: int | str) -> _Self: ...

    def __getattr__(self: _Self, attr: str) -> _Self: ...

    def exists(self) -> bool: ...

    def items(self: _Self) -> Iterator[tuple[str, _Self]]: ...

    def data(self) -> WeightData: ...

    def allocate(self, dtype: DType | None = None, shape: Iterable[Any] | None = None,
                 quantization_encoding: QuantizationEncoding | None = None,
                 device: DeviceRef = DeviceRef.CPU()) -> Weight: ...

    @property
    def allocated_weights(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class TensorInfo:
    """What a checkpoint says about one tensor (its *stored* form)."""

    name: str
    dtype: DType
    shape: tuple[int, ...]  # stored shape: (*rows, bytes_per_row) for quantized tensors
    file: str
    quantization_encoding: QuantizationEncoding | None = None
    logical_shape: tuple[int, ...] | None = None  # element shape of a quantized tensor


class WeightStore:
    """Base of the per-format stores: ``infos`` (ordered) plus ``tensor(name)``."""

    format_name = "checkpoint"

    def __init__(self) -> None:
        self.infos: dict[str, TensorInfo] = {}

    def files(self) -> list[str]:
        seen: dict[str, None] = {}
        for i in self.infos.values():
            seen.setdefault(i.file, None)
        return list(seen)

    def tensor(self, name: str) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def raw(self, name: str) -> Any:
        return self.tensor(name)

    def missing(self, name: str, what: str) -> KeyError:
        close = difflib.get_close_matches(name, list(self.infos), n=3, cutoff=0.5)
        if not close:
            close = [n for n in self.infos if n.startswith(name + ".")][:3]
        hint = f"; closest names: {close}" if close else ""
        files = self.files()
        src = files[0] if len(files) == 1 else f"{len(files)} files ({', '.join(os.path.basename(f) for f in files[:3])}{', ...' if len(files) > 3 else ''})"
        return KeyError(f"{what}: no weight named {name!r} in {self.format_name} {src}{hint}")


def progress(total_bytes: int, desc: str, unit_count: int, unit: str = "tensor") -> Any:
    """A tqdm bar counting ``unit_count`` of ``unit`` (tensors unless the caller counts files) for loads
    above PROGRESS_THRESHOLD_BYTES (None otherwise or without tqdm)."""
    if total_bytes < PROGRESS_THRESHOLD_BYTES or os.environ.get("LIBREMAX_NO_PROGRESS"):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        return None
    return tqdm(total=unit_count, desc=desc, unit=unit, leave=False)


def _as_int_shape(shape: Iterable[Any], where: str) -> tuple[int, ...]:
    out = []
    for d in shape:
        dim = Dim(d)
        if not isinstance(dim, StaticDim):
            raise ValueError(f"{where}: weight shapes must be static, got dim {d!r}")
        out.append(int(dim.dim))
    return tuple(out)


class _WeightsBase:
    """Shared implementation of the Weights protocol over a :class:`WeightStore`."""

    _store: WeightStore
    _prefix: str
    _allocated: dict[str, Any]

    def _init_base(self, store: WeightStore, prefix: str, allocated: dict[str, Any] | None) -> None:
        object.__setattr__(self, "_store", store)
        object.__setattr__(self, "_prefix", prefix)
        object.__setattr__(self, "_allocated", {} if allocated is None else allocated)

    def _child(self: _Self, prefix: str) -> _Self:
        obj = object.__new__(type(self))
        obj._init_base(self._store, prefix, self._allocated)  # type: ignore[attr-defined]
        return obj

    # ------------------------------------------------------------- navigation
    @property
    def name(self) -> str:
        """The current weight name or prefix (``"model.layers.0"``)."""
        return self._prefix

    def __getattr__(self: _Self, attr: str) -> _Self:
        if attr.startswith("_"):
            raise AttributeError(attr)
        p = self._prefix  # type: ignore[attr-defined]
        return self._child(f"{p}.{attr}" if p else attr)  # type: ignore[attr-defined]

    def __getitem__(self: _Self, idx: int | str) -> _Self:
        if isinstance(idx, bool) or not isinstance(idx, (int, str)):
            raise TypeError(f"Weights[{idx!r}]: index must be an int or str")
        p = self._prefix  # type: ignore[attr-defined]
        return self._child(f"{p}.{idx}" if p else str(idx))  # type: ignore[attr-defined]

    def __dir__(self) -> list[str]:
        p = self._prefix + "." if self._prefix else ""
        subs = {n[len(p):].split(".", 1)[0] for n in self._store.infos if n.startswith(p)}
        return sorted(set(super().__dir__()) | subs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._prefix!r}, {len(self._store.infos)} tensors)"

    def exists(self) -> bool:
        """True if a weight with exactly this name is in the checkpoint."""
        return self._prefix in self._store.infos

    def items(self: _Self) -> Iterator[tuple[str, _Self]]:
        """``(name relative to this prefix, accessor)`` for every weight under the prefix."""
        p = self._prefix  # type: ignore[attr-defined]
        pre = p + "." if p else ""
        for n in list(self._store.infos):  # type: ignore[attr-defined]
            if n.startswith(pre) and n != p:
                yield n[len(pre):], self._child(n)  # type: ignore[attr-defined]

    def keys(self) -> list[str]:
        """Full names of every weight under this prefix (libremax helper)."""
        pre = self._prefix + "." if self._prefix else ""
        return [pre + n for n, _ in self.items()]

    # ------------------------------------------------------------- metadata
    def _info(self, what: str) -> TensorInfo:
        info = self._store.infos.get(self._prefix)
        if info is None:
            raise self._store.missing(self._prefix, what)
        return info

    @property
    def dtype(self) -> DType:
        """The stored dtype of this weight (uint8 for quantized blocks)."""
        return self._info("dtype").dtype

    @property
    def shape(self) -> Shape:
        """The stored shape of this weight."""
        return Shape(list(self._info("shape").shape))

    @property
    def quantization_encoding(self) -> QuantizationEncoding | None:
        """The block encoding of this weight, or None for a plain tensor."""
        return self._info("quantization_encoding").quantization_encoding

    # ------------------------------------------------------------- data
    def data(self) -> WeightData:
        """The tensor (memory-mapped, not copied) with its metadata; KeyError when missing."""
        info = self._info("data()")
        t = self._store.tensor(info.name)
        return WeightData(t, info.name, info.dtype, Shape(list(info.shape)), info.quantization_encoding)

    def raw_tensor(self) -> Any:
        """The format's own tensor object (torch tensor; ``gguf.ReaderTensor`` for GGUF)."""
        info = self._info("raw_tensor()")
        return self._store.raw(info.name)

    @property
    def allocated_weights(self) -> dict[str, Any]:
        """Name -> DLPack array (torch tensor) of every weight allocated so far."""
        return dict(self._allocated)

    def allocate(self, dtype: DType | None = None, shape: Iterable[Any] | None = None,
                 quantization_encoding: QuantizationEncoding | None = None,
                 device: DeviceRef = DeviceRef.CPU()) -> Weight:
        """A graph :class:`Weight` for this tensor, validated against the file.

        ``dtype``: None keeps the stored dtype; another float dtype converts a
        float tensor (the converted copy is what ``allocated_weights`` holds);
        anything else must match.  ``shape``: must equal the stored shape (for a
        quantized tensor, the block shape ``(*rows, bytes_per_row)``).
        ``quantization_encoding``: must match the stored encoding when given.
        """
        info = self._info("allocate()")
        where = f"{self._store.format_name} {info.file}: tensor {info.name!r}"
        enc = info.quantization_encoding
        if quantization_encoding is not None and not isinstance(quantization_encoding, QuantizationEncoding):
            raise TypeError(f"allocate: quantization_encoding must be a QuantizationEncoding, got {quantization_encoding!r}")
        if dtype is not None and not isinstance(dtype, DType):
            raise TypeError(f"allocate: dtype must be a DType, got {dtype!r}")
        if enc is not None:
            if quantization_encoding is not None and quantization_encoding is not enc:
                raise ValueError(
                    f"{where} is quantized as {enc._name_}, but allocate() asked for {quantization_encoding._name_}"
                )
            if dtype is not None and dtype != DType.uint8:
                raise ValueError(
                    f"{where} is quantized as {enc._name_} (stored as uint8 blocks, shape {list(info.shape)}, "
                    f"{list(info.logical_shape or ())} values); allocate() asked for dtype {dtype}. "
                    f"Allocate it as DType.uint8, or dequantize with data().astype({dtype})"
                )
        elif quantization_encoding is not None:
            raise ValueError(
                f"{where} is stored unquantized as {info.dtype}, but allocate() asked for "
                f"quantization_encoding={quantization_encoding._name_} (libremax does not quantize at load time)"
            )
        out_dtype = info.dtype if dtype is None else dtype
        if out_dtype != info.dtype and not (out_dtype.is_float() and info.dtype.is_float()):
            raise ValueError(
                f"{where} has dtype {info.dtype}, allocate() asked for {out_dtype}; only float-to-float "
                f"conversion is done at load time"
            )
        if shape is not None:
            want = _as_int_shape(shape, f"allocate({info.name!r})")
            if want != tuple(info.shape):
                extra = (
                    f" ({enc._name_} blocks of {list(info.logical_shape or ())} values are stored as uint8 {list(info.shape)})"
                    if enc is not None else ""
                )
                raise ValueError(
                    f"{where} has shape {list(info.shape)}, allocate() asked for shape {list(want)}{extra}"
                )
        t = self._store.tensor(info.name)
        if out_dtype != info.dtype:
            t = t.to(out_dtype.to_torch())
        w = Weight(info.name, out_dtype, list(info.shape), device, quantization_encoding=enc)
        self._allocated[info.name] = t
        return w
