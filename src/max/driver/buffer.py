"""``Buffer`` (also exported as ``Tensor``): device-resident strided memory.

A Buffer wraps a ``torch.Tensor`` (attribute ``_t``) and its ``DType``
(``_dtype``).  The engine wraps every model output with
``Buffer._from_torch(t)`` and reads inputs with ``buf._torch()``; both are
zero-copy and cheap.

Negative-step slicing
---------------------
numpy allows negative strides, torch does not.  A Buffer therefore keeps its
torch tensor with positive strides plus ``_flip``, the tuple of axes that are
logically reversed (None in the common case).  ``buf[::-1]`` is a true view:

* reads and writes through it see and change the parent's memory
  (``__getitem__`` / ``__setitem__`` compose flips with further indexing);
* ``to_numpy()`` on the host returns a numpy view with negative strides that
  shares the memory;
* ``is_contiguous`` is False (as the reference specifies for negative steps);
* ``_torch()``, ``__dlpack__`` and copies to other devices materialise the
  reversed data with ``torch.flip`` (a copy: torch cannot express the view).
  ``__dlpack__(copy=False)`` on such a buffer raises BufferError.

Pinned memory
-------------
``pinned=True`` allocates page-locked *host* memory (``pin_memory=True``).  If
the requested device is an accelerator the buffer still lives on the host (its
``device`` is the CPU, ``pinned`` is True), ready for fast asynchronous copies
with ``to(accelerator)``.  On a host without CUDA/ROCm there is no page-locked
allocator: the request is ignored and the buffer is ordinary host memory with
``pinned == False``.

Read-only memory
----------------
As in MAX 26.7, a Buffer is always writable.  ``from_numpy``/``from_dlpack``
copy a read-only numpy array (the source stays unchanged); ``Buffer.mmap``
with mode ``'r'`` maps the file privately (copy-on-write: writes stay in
memory, the file is unchanged, nothing is copied until written).  Only the
older ``MemMapTensor`` with mode ``'r'`` is read-only: ``__setitem__`` and
``inplace_copy_from`` raise ValueError and ``to_numpy()`` returns a
non-writeable array.

Misaligned views
----------------
``view`` may reinterpret bytes at an offset that is not a multiple of the new
element size (``buf[1:].view(DType.int32)`` of a uint8 buffer): the view
shares the memory; ``_aligned()`` is False for it and ``copy()`` gives an
aligned buffer.
"""

from __future__ import annotations

import math
import numbers
import operator
import os
import warnings
from contextlib import nullcontext
from typing import Any, Iterator, Optional, Protocol, Sequence, runtime_checkable

import numpy as np
import torch

from max.driver.device import CPU, Device, accelerator_count, device_from_torch
from max.driver.stream import DeviceStream
from max.dtype import DType, torch_storage_dtype
from max.dtype.dtype import BIT_STORED

__all__ = ["Buffer", "Tensor", "MemMapTensor", "DLPackArray"]


@runtime_checkable
class DLPackArray(Protocol):
    """Anything implementing the DLPack protocol (numpy, torch, Buffer...)."""

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...

    def __dlpack_device__(self) -> Any: ...


# torch dtype -> DType, built once (the hot path of ``_from_torch``).
_TORCH2DT: dict = {dt.to_torch(): dt for dt in DType if dt not in BIT_STORED}
# DTypes numpy only knows through ml_dtypes: moved across by viewing the bits
# as same-width unsigned integers.
# MAX 26.7's from_dlpack texts for non-contiguous sources
_NONCONTIGUOUS_ARRAY = ("driver buffer's from_dlpack only accepts contiguous arrays. "
                        "First call np.ascontiguousarray(array)")
_NONCONTIGUOUS_TORCH = ("driver buffer's from_dlpack only accepts contiguous tensors. "
                        "First call .contiguous() on the tensor")

_BITS_DTYPES = {
    DType.bfloat16: (np.uint16, torch.uint16),
    DType.float8_e4m3fn: (np.uint8, torch.uint8),
    DType.float8_e4m3fnuz: (np.uint8, torch.uint8),
    DType.float8_e5m2: (np.uint8, torch.uint8),
    DType.float8_e5m2fnuz: (np.uint8, torch.uint8),
    DType.float8_e8m0fnu: (np.uint8, torch.uint8),
    # no torch dtype at all: the torch tensor holds the uint8 bit patterns
    DType.float4_e2m1fn: (np.uint8, torch.uint8),
    DType.float6_e2m3fn: (np.uint8, torch.uint8),
    DType.float6_e3m2fn: (np.uint8, torch.uint8),
}

# torch has no flip kernel for these; flip the bits through a same-width int view.
_FLIP_VIA = {
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e4m3fnuz: torch.uint8,
    torch.float8_e5m2: torch.uint8,
    torch.float8_e5m2fnuz: torch.uint8,
    torch.float8_e8m0fnu: torch.uint8,
    torch.uint16: torch.int16,
    torch.uint32: torch.int32,
    torch.uint64: torch.int64,
}


def _tflip(t: torch.Tensor, dims: tuple) -> torch.Tensor:
    """``torch.flip`` for every dtype a Buffer can hold (a copy)."""
    via = _FLIP_VIA.get(t.dtype)
    if via is None:
        return torch.flip(t, dims)
    return torch.flip(t.view(via), dims).view(t.dtype)


_CUDA: Optional[bool] = None


def _cuda_ok() -> bool:
    global _CUDA
    if _CUDA is None:
        _CUDA = accelerator_count() > 0
    return _CUDA


def _dtype_of(t: torch.Tensor) -> DType:
    dt = _TORCH2DT.get(t.dtype)
    if dt is None:
        return DType.from_torch(t.dtype)  # raises ValueError naming the torch dtype
    return dt


def _check_dtype(dtype: Any, who: str) -> DType:
    if isinstance(dtype, DType):
        return dtype
    hint = ""
    if isinstance(dtype, torch.dtype):
        hint = " (convert with DType.from_torch)"
    elif isinstance(dtype, (np.dtype, type)) or isinstance(dtype, str):
        hint = " (convert with DType.from_numpy)"
    raise TypeError(f"{who}: dtype must be a max.dtype.DType, got {dtype!r} ({type(dtype).__name__}){hint}")


def _check_shape(shape: Any, who: str) -> tuple[int, ...]:
    """Validate a shape: a sequence (or a single int) of non-negative ints."""
    if isinstance(shape, (bool, np.bool_)):
        raise TypeError(f"{who}: shape must be a sequence of non-negative ints, got {shape!r}")
    if isinstance(shape, (int, np.integer)):
        dims: Sequence[Any] = (shape,)
    elif isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise TypeError(
            f"{who}: shape must be a sequence of non-negative ints, got {type(shape).__name__} {shape!r}"
        )
    else:
        dims = list(shape)
    out = []
    for i, d in enumerate(dims):
        if isinstance(d, (bool, np.bool_)) or not hasattr(d, "__index__"):
            raise TypeError(
                f"{who}: shape entries must be ints, got {type(d).__name__} {d!r} "
                f"at position {i} of shape {shape!r}"
            )
        v = operator.index(d)
        if v < 0:
            raise ValueError(
                f"{who}: shape entries must be non-negative, got {v} at position {i} of shape {shape!r}"
            )
        out.append(v)
    return tuple(out)


def _check_device(device: Any, who: str) -> Device:
    if device is None:
        return CPU()
    if not isinstance(device, Device):
        raise TypeError(f"{who}: device must be a max.driver.Device, got {type(device).__name__} {device!r}")
    return device


def _stream_ctx(stream: Optional[DeviceStream]):
    if stream is None or stream._ts is None:
        return nullcontext()
    return torch.cuda.stream(stream._ts)


def _wrap(
    t: torch.Tensor,
    flip: Optional[tuple] = None,
    ro: bool = False,
    stream: Optional[DeviceStream] = None,
    dtype: Optional[DType] = None,
) -> "Buffer":
    b = object.__new__(Buffer)
    b._t = t
    b._dtype = _dtype_of(t) if dtype is None else dtype
    b._stream = stream
    b._flip = flip
    b._ro = ro
    return b


# ----------------------------------------------------------------- numpy <-> torch
def _share_numpy(arr: np.ndarray, dt: DType) -> tuple[torch.Tensor, Optional[tuple], bool, bool]:
    """A torch tensor sharing ``arr``'s memory: ``(tensor, flips, read_only, copied)``.

    Strides are kept; negative ones become flips.  Only strides that are not a
    multiple of the item size force a copy (``copied`` is then True).
    """
    ro = not arr.flags.writeable
    copied = False
    if arr.size == 0:
        return torch.empty(arr.shape, dtype=torch_storage_dtype(dt)), None, False, False
    bits = _BITS_DTYPES.get(dt)
    if bits is not None:  # torch.from_numpy does not know ml_dtypes: move the bits
        arr = arr.view(bits[0])
    flips: Optional[tuple] = None
    if any(s < 0 for s in arr.strides):
        neg = tuple(i for i, s in enumerate(arr.strides) if s < 0 and arr.shape[i] > 1)
        if neg:
            arr = np.flip(arr, neg)
            flips = neg
        if any(s < 0 for s in arr.strides):  # size-1 axes: their stride is irrelevant
            strides = tuple(0 if s < 0 else s for s in arr.strides)
            arr = np.lib.stride_tricks.as_strided(arr, arr.shape, strides, writeable=not ro)
    if any(s % arr.itemsize for s in arr.strides):
        arr = np.array(arr, copy=True)  # strides torch cannot express (e.g. structured field views)
        flips, ro, copied = None, False, True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # non-writable arrays: we track read-only ourselves
        t = torch.from_numpy(arr)
    if bits is not None:
        t = t.view(torch_storage_dtype(dt))
    return t, flips, ro, copied


def _numpy_of(t: torch.Tensor, dt: DType) -> np.ndarray:
    """A numpy array sharing a host tensor's memory (ml_dtypes for bf16/fp8)."""
    if t.requires_grad:
        t = t.detach()
    bits = _BITS_DTYPES.get(dt)
    if bits is None:
        return t.numpy()
    return t.view(bits[1]).numpy().view(dt.to_numpy())


def numpy_to_torch(arr: np.ndarray, *, copy: bool = False) -> torch.Tensor:
    """A host torch tensor with ``arr``'s values: shares the memory unless ``copy`` (or a
    non-contiguous array); bfloat16/float8 move as bits, float4/float6 as uint8 bit
    patterns.  The one numpy -> torch conversion (Buffers, constants, folding, eager)."""
    arr, dt = _np_dtype(np.asarray(arr), "numpy_to_torch")
    if copy or not arr.flags.c_contiguous:
        arr = np.array(arr, order="C", copy=True)
    return _share_numpy(arr, dt)[0]


def torch_to_numpy(t: torch.Tensor, dtype: DType) -> np.ndarray:
    """A numpy view of host tensor ``t`` holding ``dtype`` values (ml_dtypes for bf16/fp8/fp4/fp6)."""
    return _numpy_of(t.detach().contiguous(), dtype)


def _np_dtype(arr: np.ndarray, who: str) -> tuple[np.ndarray, DType]:
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    try:
        dt = DType.from_numpy(arr.dtype)
    except ValueError as e:
        raise ValueError(f"{who}: {e}") from None
    return arr, dt


# ------------------------------------------------------------------------ Buffer
class Buffer:
    """Device-resident strided buffer (the reference's ``Buffer`` / ``Tensor``).

    Constructors::

        Buffer(dtype=DType.float32, shape=[2, 3])            # CPU
        Buffer(DType.float32, [2, 3], device)                 # or (dtype, shape, stream)
        Buffer(shape=[2, 3], dtype=DType.float32, device=gpu)
        Buffer([2, 3], DType.float32)                         # older (shape, dtype[, device])
        Buffer(ndarray, device)                               # copy of the array's data on device

    Memory from the constructor is uninitialised; use ``Buffer.zeros`` for zeros.
    See the module docstring for negative-step views, pinned and read-only memory.
    """

    __slots__ = ("_t", "_dtype", "_stream", "_flip", "_ro")

    _t: torch.Tensor
    _dtype: DType
    _stream: Optional[DeviceStream]
    _flip: Optional[tuple]
    _ro: bool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        data, dtype, shape, device, stream, pinned = _parse_ctor(args, kwargs)
        if data is not None:
            arr, dt = _np_dtype(np.asarray(data), "Buffer")
            t = _share_numpy(np.ascontiguousarray(arr) if arr.ndim else arr, dt)[0]
            self._t = t.to(device._torch_device, copy=True)
            self._dtype, self._stream, self._flip, self._ro = dt, None, None, False
            return
        self._init_alloc(dtype, shape, device, stream, pinned, zero=False)

    def _init_alloc(self, dtype, shape, device, stream, pinned, zero: bool) -> None:
        tdt = torch_storage_dtype(dtype)
        make = torch.zeros if zero else torch.empty
        if pinned:
            if _cuda_ok():
                t = make(shape, dtype=tdt, pin_memory=True)
            else:  # no page-locked allocator without CUDA/ROCm: plain host memory
                t = make(shape, dtype=tdt)
            stream = None
        elif device.is_host:
            t = make(shape, dtype=tdt)
        else:
            with _stream_ctx(stream):
                t = make(shape, dtype=tdt, device=device._torch_device)
        self._t = t
        self._dtype = dtype
        self._stream = stream
        self._flip = None
        self._ro = False

    # ------------------------------------------------------------ engine hooks
    @classmethod
    def _from_torch(cls, t: torch.Tensor, dtype: Optional[DType] = None) -> "Buffer":
        """Wrap a torch tensor without copying (dtype from ``t.dtype`` unless given:
        the bit-stored types float4/float6 are held as uint8 tensors)."""
        b = object.__new__(Buffer)
        b._t = t
        if dtype is not None and dtype in BIT_STORED:
            b._dtype = dtype
        else:
            dt = _TORCH2DT.get(t.dtype)
            b._dtype = dt if dt is not None else DType.from_torch(t.dtype)
        b._stream = None
        b._flip = None
        b._ro = False
        return b

    def _torch(self) -> torch.Tensor:
        """The wrapped tensor (no copy), or a flipped copy for a negative-step view."""
        if self._flip is None:
            return self._t
        return _tflip(self._t, self._flip)

    # ------------------------------------------------------------ properties
    @property
    def shape(self) -> tuple[int, ...]:
        """Shape as a tuple of ints."""
        return tuple(self._t.shape)

    @property
    def dtype(self) -> DType:
        """Element type."""
        return self._dtype

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return self._t.dim()

    @property
    def num_elements(self) -> int:
        """Number of elements (1 for rank 0)."""
        return self._t.numel()

    @property
    def element_size(self) -> int:
        """Bytes per element."""
        return self._dtype.size_in_bytes

    @property
    def device(self) -> Device:
        """Device holding the memory."""
        return device_from_torch(self._t.device)

    @property
    def stream(self) -> DeviceStream:
        """Stream the buffer is bound to (the device's default stream unless given)."""
        s = self._stream
        return s if s is not None else self.device.default_stream

    @property
    def pinned(self) -> bool:
        """Whether the memory is page-locked host memory."""
        t = self._t
        return t.device.type == "cpu" and _cuda_ok() and bool(t.is_pinned())

    @property
    def is_host(self) -> bool:
        """True for host (CPU) memory."""
        return self._t.device.type == "cpu"

    @property
    def is_contiguous(self) -> bool:
        """Whether the buffer is densely packed in row-major order (False for negative steps)."""
        return self._flip is None and self._t.is_contiguous()

    # ------------------------------------------------------------ factories
    @classmethod
    def zeros(cls, *args: Any, **kwargs: Any) -> "Buffer":
        """``Buffer.zeros(shape, dtype, device=CPU())`` (``(dtype, shape)`` also accepted)."""
        data, dtype, shape, device, stream, pinned = _parse_ctor(args, kwargs, who="Buffer.zeros")
        if data is not None:
            raise TypeError("Buffer.zeros: expected (shape, dtype[, device]), got an ndarray and no dtype")
        b = object.__new__(Buffer)
        b._init_alloc(dtype, shape, device, stream, pinned, zero=True)
        return b

    @classmethod
    def scalar(cls, value: Any, dtype: DType, device: Optional[Device] = None) -> "Buffer":
        """A rank-0 buffer holding ``value`` as ``dtype``; ValueError if it does not fit."""
        dtype = _check_dtype(dtype, "Buffer.scalar")
        device = _check_device(device, "Buffer.scalar")
        if isinstance(value, (np.ndarray, torch.Tensor, Buffer)):
            if len(value.shape) != 0:
                raise ValueError(
                    f"Buffer.scalar: expected a single value, got an array of shape {tuple(value.shape)}"
                )
            value = value.item()
        if isinstance(value, np.generic):
            value = value.item()
        if not isinstance(value, (numbers.Number, bool)) or isinstance(value, complex):
            raise TypeError(
                f"Buffer.scalar: value must be a real number or bool, got {type(value).__name__} {value!r}"
            )
        if dtype.is_integral() or dtype is DType.bool:
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"Buffer.scalar: {value!r} cannot be stored as {dtype}")
        try:
            if dtype in _BITS_DTYPES and dtype not in (DType.bfloat16,):
                arr = np.array(value, dtype=np.float64).astype(dtype.to_numpy())
                t = _share_numpy(arr.reshape(1), dtype)[0].reshape(()).to(device._torch_device)
            else:
                t = torch.tensor(value, dtype=dtype.to_torch(), device=device._torch_device)
        except (RuntimeError, OverflowError) as e:
            raise ValueError(f"Buffer.scalar: {value!r} does not fit in {dtype} ({e})") from None
        return _wrap(t, dtype=dtype)

    @classmethod
    def from_numpy(cls, arr: np.ndarray) -> "Buffer":
        """A host buffer sharing ``arr``'s memory (copies only a non-contiguous array).

        bfloat16/float8 arrays (``ml_dtypes``) are supported.  ValueError for
        numpy types with no DType (complex, str, object...).
        """
        if isinstance(arr, np.generic):
            arr = np.asarray(arr)
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"Buffer.from_numpy: expected a numpy.ndarray, got {type(arr).__name__}")
        arr, dt = _np_dtype(arr, "Buffer.from_numpy")
        if not arr.flags.c_contiguous or not arr.flags.writeable:  # read-only sources are copied
            arr = np.array(arr, order="C", copy=True)
        t, flips, ro, _ = _share_numpy(arr, dt)
        return _wrap(t, flips, ro, dtype=dt)

    @classmethod
    def from_dlpack(cls, array: Any, *, copy: Optional[bool] = None) -> "Buffer":
        """A buffer over any DLPack producer (numpy, torch, Buffer, ...), usually zero-copy.

        ``copy=True`` always copies; ``copy=False`` raises BufferError when a copy
        would be needed.  numpy arrays (bfloat16/float8 included, whose dtypes
        DLPack cannot carry, and arrays with negative strides) are imported
        through the numpy buffer directly.
        """
        if isinstance(array, Buffer):
            return array.copy() if copy else array  # MAX: the same object
        if isinstance(array, torch.Tensor):
            t = array.detach()
            _dtype_of(t)
            if not t.is_contiguous() and not copy:
                raise ValueError(_NONCONTIGUOUS_TORCH + f" (shape {tuple(t.shape)}, strides {t.stride()})")
            return _wrap(t.clone(memory_format=torch.contiguous_format) if copy else t)
        if isinstance(array, (np.ndarray, np.generic)):
            arr = np.asarray(array)
            if not arr.flags.c_contiguous and not copy:
                raise ValueError(_NONCONTIGUOUS_ARRAY + f" (shape {arr.shape}, strides {arr.strides})")
            arr, dt = _np_dtype(arr, "Buffer.from_dlpack")
            if not arr.flags.writeable:
                if copy is False:
                    raise BufferError("Buffer.from_dlpack: a read-only array cannot be imported without a copy")
                copy = True  # MAX copies read-only sources (np.memmap mode 'r', writeable=False)
            if copy:
                arr = np.array(arr, order="C", copy=True)
            t, flips, ro, copied = _share_numpy(arr, dt)
            if copy is False and copied:
                raise BufferError("Buffer.from_dlpack: the array cannot be imported without a copy")
            return _wrap(t, flips, ro, dtype=dt)
        if not hasattr(array, "__dlpack__"):
            raise TypeError(
                "Buffer.from_dlpack: expected an object implementing __dlpack__ (numpy array, "
                f"torch tensor, Buffer...), got {type(array).__name__}"
            )
        try:
            t = torch.from_dlpack(array) if copy is None else torch.from_dlpack(array, copy=copy)
        except TypeError:  # older torch without the copy keyword
            t = torch.from_dlpack(array)
            if copy:
                t = t.clone()
        if not t.is_contiguous():
            if not copy:
                raise ValueError(_NONCONTIGUOUS_ARRAY + f" (shape {tuple(t.shape)}, strides {t.stride()})")
            t = t.contiguous()
        return _wrap(t)

    @classmethod
    def mmap(
        cls,
        filename: "os.PathLike[str] | str",
        dtype: DType,
        shape: Any,
        mode: str = "copyonwrite",
        offset: int = 0,
    ) -> "Buffer":
        """A host buffer over a memory-mapped file (``np.memmap`` semantics, zero-copy).

        Modes: ``'r+'``/``'readwrite'`` (writes reach the file), ``'w+'``/``'write'``
        (create/overwrite), ``'c'``/``'copyonwrite'`` and, as in MAX 26.7,
        ``'r'``/``'readonly'`` (a private mapping: writes stay in memory, the file
        is unchanged).
        """
        if mode in ("r", "readonly"):
            mode = "c"
        t, ro, dt = _memmap(filename, dtype, shape, mode, offset, "Buffer.mmap")
        return _wrap(t, None, ro, dtype=dt)

    # ------------------------------------------------------------ conversions
    def to_numpy(self) -> np.ndarray:
        """A numpy array of the contents: shares memory on the host, copies from a device.

        bfloat16/float8 buffers give ``ml_dtypes`` arrays.
        """
        t = self._t
        if t.device.type != "cpu":
            t = t.cpu()
        arr = _numpy_of(t, self._dtype)
        if self._flip is not None:
            arr = np.flip(arr, self._flip)
        if self._ro:
            arr = arr.view()
            arr.flags.writeable = False
        return arr

    def __array__(self, dtype: Any = None, copy: Optional[bool] = None) -> np.ndarray:
        if copy is False and not self.is_host:
            raise ValueError("Buffer.__array__: a device buffer cannot be viewed without a copy")
        arr = self.to_numpy()
        if dtype is not None:
            arr = arr.astype(dtype, copy=False)
        if copy:
            arr = arr.copy()
        return arr

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        """Export through DLPack (zero-copy except for negative-step views)."""
        t = self._t
        if self._flip is not None:
            if kwargs.get("copy") is False:
                raise BufferError(
                    "Buffer.__dlpack__: a view with negative steps cannot be exported without a copy"
                )
            t = _tflip(t, self._flip)
        if t.requires_grad:
            t = t.detach()
        return t.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self._t.__dlpack_device__()

    def item(self) -> Any:
        """The value of a one-element buffer (rank 0, or any shape holding one element) as a Python scalar."""
        n = self._t.numel()
        if n != 1:
            raise ValueError(f"calling `item` on a tensor with {n} items but expected only 1 (shape {self.shape}; "
                             "index it down to a single element first, e.g. buf[0, 0].item())")
        if self._dtype in BIT_STORED:
            return self.to_numpy().astype(np.float64).reshape(()).item()
        return self._t.reshape(()).item()

    # ------------------------------------------------------------ copies and moves
    def _target(self, device: Any, stream: Any, who: str) -> tuple[Device, Optional[DeviceStream]]:
        if isinstance(device, DeviceStream):
            if stream is not None:
                raise TypeError(f"{who}: give a device or a stream, not both")
            device, stream = None, device
        if stream is not None:
            if not isinstance(stream, DeviceStream):
                raise TypeError(f"{who}: stream must be a DeviceStream, got {type(stream).__name__}")
            return stream.device, stream
        if device is None:
            return self.device, self._stream
        if not isinstance(device, Device):
            raise TypeError(
                f"{who}: expected a Device, a DeviceStream or None, got {type(device).__name__} {device!r}"
            )
        return device, None

    def copy(self, device: Any = None, *, stream: Optional[DeviceStream] = None) -> "Buffer":
        """A deep, contiguous copy on ``device`` / the stream's device (default: the same device)."""
        dev, st = self._target(device, stream, "Buffer.copy")
        src = self._t
        flipped = self._flip is not None
        if flipped:
            src = _tflip(src, self._flip)
        with _stream_ctx(st if not dev.is_host else None):
            t = src.to(dev._torch_device, memory_format=torch.contiguous_format, copy=not flipped)
        return _wrap(t, None, False, st if st is not None and st.device == dev else None, self._dtype)

    def contiguous(self) -> "Buffer":
        """A contiguous copy of this buffer (always a new allocation)."""
        return self.copy()

    def to(self, target: Any) -> "Buffer | list[Buffer]":
        """This buffer on ``target`` (a Device, a DeviceStream, or a list of either).

        No copy is made when the buffer is already on that device: a Device
        target returns ``self``; a stream target returns a new reference to the
        same memory bound to that stream.
        """
        if isinstance(target, (list, tuple)):
            return [self.to(x) for x in target]
        if isinstance(target, DeviceStream):
            if target.device == self.device:
                return _wrap(self._t, self._flip, self._ro, target, self._dtype)
            return self._move(target.device, target)
        if isinstance(target, Device):
            if target == self.device:
                return self
            return self._move(target, None)
        raise TypeError(
            "Buffer.to: expected a Device, a DeviceStream or a list of them, "
            f"got {type(target).__name__} {target!r}"
        )

    def _move(self, device: Device, stream: Optional[DeviceStream]) -> "Buffer":
        src = self._torch()
        non_blocking = (not device.is_host) and self.pinned
        with _stream_ctx(stream if not device.is_host else None):
            t = src.to(device._torch_device, non_blocking=non_blocking)
        return _wrap(t, None, False, stream, self._dtype)

    def inplace_copy_from(self, src: "Buffer") -> None:
        """Copy ``src``'s bytes into this buffer (devices may differ).

        Both buffers must be contiguous and hold the same number of bytes; with
        equal dtypes that means the same number of elements (shapes may differ),
        with different dtypes the raw bytes are copied.
        """
        if not isinstance(src, Buffer):
            raise TypeError(f"inplace_copy_from: src must be a Buffer, got {type(src).__name__}")
        if self._ro:
            raise ValueError("inplace_copy_from: the destination buffer is read-only")
        if src is self or (
                src._dtype is self._dtype and src._flip == self._flip and src._t.device == self._t.device
                and src._t.data_ptr() == self._t.data_ptr() and src._t.shape == self._t.shape
                and src._t.stride() == self._t.stride()):
            return  # the same memory, the same layout: nothing to copy (any layout)
        # MAX 26.7's texts, whose roles read swapped: a non-contiguous *destination* says "from"
        if not self.is_contiguous:
            raise ValueError(f"Cannot copy from non-contiguous buffer (inplace_copy_from: the destination, shape "
                             f"{self.shape}, is not contiguous)")
        if not src.is_contiguous:
            raise ValueError(f"Cannot copy to non-contiguous buffer (inplace_copy_from: the source, shape "
                             f"{src.shape}, is not contiguous; use src.contiguous())")
        nd = self.num_elements * self.element_size
        ns = src.num_elements * src.element_size
        if nd != ns:
            raise ValueError(
                f"inplace_copy_from: sizes differ: source is {src.shape} {src.dtype} ({ns} bytes), "
                f"destination is {self.shape} {self.dtype} ({nd} bytes)"
            )
        if nd == 0:
            return
        d = self._t.reshape(-1)
        s = src._t.reshape(-1)
        if self._dtype is not src._dtype:
            d = d.view(torch.uint8)
            s = s.view(torch.uint8)
        if d.device == s.device and d.untyped_storage().data_ptr() == s.untyped_storage().data_ptr():
            s = s.clone()
        with _stream_ctx(self._stream if not self.is_host else None):
            d.copy_(s)

    def view(self, dtype: DType, shape: Optional[Sequence[int]] = None) -> "Buffer":
        """Reinterpret the memory as ``dtype`` (and ``shape``) without copying.

        Without ``shape``, the last dimension is rescaled by the ratio of element
        sizes (ValueError when that does not divide, or for rank 0 with a
        different element size).  With ``shape``, the byte counts must match.
        A non-contiguous buffer can only be viewed as a same-size dtype keeping
        its shape.
        """
        dtype = _check_dtype(dtype, "Buffer.view")
        old, new = self.element_size, dtype.size_in_bytes
        tdt = torch_storage_dtype(dtype)
        if shape is not None:
            shape = _check_shape(shape, "Buffer.view")
        if not self.is_contiguous:
            if new == old and (shape is None or shape == self.shape):
                return _wrap(self._t.view(tdt), self._flip, self._ro, self._stream, dtype)
            raise ValueError(
                f"Buffer.view({dtype}, shape={shape}): the buffer (shape {self.shape}) is not "
                "contiguous; only a same-size dtype with the same shape can be viewed. "
                "Call .contiguous() first"
            )
        nbytes = self.num_elements * old
        if shape is None:
            if new == old:
                shape = self.shape
            else:
                last = self.shape[-1] if self.shape else None
                if last is None or (last * old) % new:
                    raise ValueError(
                        f"Buffer.view({dtype}): cannot deduce a shape for a {self.dtype} buffer of "
                        f"shape {self.shape}: the last dimension holds {0 if last is None else last * old} "
                        f"bytes, not a multiple of {new}; pass shape="
                    )
                shape = self.shape[:-1] + (last * old // new,)
        want = math.prod(shape) * new
        if want != nbytes:
            raise ValueError(
                f"Buffer.view({dtype}, shape={shape}): needs {want} bytes but the buffer holds "
                f"{nbytes} bytes ({self.dtype}, shape {self.shape})"
            )
        raw = self._t.reshape(-1).view(torch.uint8)
        if raw.data_ptr() % new and raw.is_cpu:
            # an offset torch cannot view as the wider type: numpy can, sharing the memory
            t = torch.from_numpy(raw.numpy().view(np.dtype(f"i{new}"))).view(tdt).view(shape)
            return _wrap(t, None, self._ro, self._stream, dtype)
        try:
            t = raw.view(tdt).view(shape)
        except RuntimeError as e:
            raise ValueError(f"Buffer.view({dtype}, shape={shape}): {e}") from None
        return _wrap(t, None, self._ro, self._stream, dtype)

    def _aligned(self, alignment: Optional[int] = None) -> bool:
        """Whether the data address is a multiple of ``alignment`` (default: the element size)."""
        a = alignment if alignment is not None else max(1, self.element_size)
        return self._t.data_ptr() % a == 0

    # ------------------------------------------------------------ indexing
    def _resolve(self, key: Any) -> tuple[torch.Tensor, Optional[tuple]]:
        if not isinstance(key, tuple):
            key = (key,)
        t = self._t
        shape = t.shape
        ndim = len(shape)
        fset = self._flip or ()
        n_ell = 0
        consumed = 0
        for k in key:
            if k is Ellipsis:
                n_ell += 1
            elif k is not None:
                consumed += 1
        if n_ell > 1:
            raise IndexError(f"an index can only have a single ellipsis ('...'), got {key!r}")
        if consumed > ndim:  # MAX 26.7's ValueError
            raise ValueError(
                f"the provided number of indices ({consumed}) is not equal to the tensor rank ({ndim}) "
                f"(buffer shape {tuple(shape)}, index {key!r})"
            )
        phys: list = []
        out_flips: list = []
        ax = 0
        out_ax = 0
        for k in key:
            if k is Ellipsis:
                for _ in range(ndim - consumed):
                    phys.append(slice(None))
                    if ax in fset:
                        out_flips.append(out_ax)
                    ax += 1
                    out_ax += 1
            elif k is None:
                phys.append(None)
                out_ax += 1
            elif isinstance(k, slice):
                n = shape[ax]
                try:
                    start, stop, step = k.indices(n)
                except TypeError:
                    raise TypeError(
                        f"slice indices must be integers or None, got {k!r} for axis {ax}"
                    ) from None
                count = len(range(start, stop, step))
                if ax in fset:
                    first, pstep = n - 1 - start, -step
                else:
                    first, pstep = start, step
                if count == 0:
                    phys.append(slice(0, 0))
                elif pstep > 0:
                    phys.append(slice(first, first + pstep * (count - 1) + 1, pstep))
                else:
                    low = first + pstep * (count - 1)
                    phys.append(slice(low, first + 1, -pstep))
                    out_flips.append(out_ax)
                ax += 1
                out_ax += 1
            else:
                if isinstance(k, (bool, np.bool_)) or not hasattr(k, "__index__"):
                    raise TypeError(
                        "Buffer indices must be ints, slices, Ellipsis or None; "
                        f"got {type(k).__name__} {k!r}"
                    )
                i = operator.index(k)
                n = shape[ax]
                if i < -n or i >= n:
                    raise IndexError(f"index {i} is out of bounds for axis {ax} with size {n}")
                if i < 0:
                    i += n
                if ax in fset:
                    i = n - 1 - i
                phys.append(i)
                ax += 1
        while ax < ndim:
            if ax in fset:
                out_flips.append(out_ax)
            ax += 1
            out_ax += 1
        return t[tuple(phys)], (tuple(out_flips) if out_flips else None)

    def __getitem__(self, key: Any) -> "Buffer":
        """A numpy-style view: ints, slices (any step, negative too), ``...`` and ``None``."""
        t, flips = self._resolve(key)
        return _wrap(t, flips, self._ro, self._stream, self._dtype)

    def __setitem__(self, key: Any, value: Any) -> None:
        """Assign one element: ``buf[i, j] = v`` with an integer index for every dim (``buf[()]``
        or ``buf[...]`` for a rank-0 buffer).  As in MAX, a slice or a partial index (setting items
        across several indices) raises ValueError: copy into a view with
        ``buf[a:b].inplace_copy_from(src)`` instead."""
        if self._ro:
            raise ValueError("Buffer.__setitem__: the buffer is read-only")
        if not self.shape and _is_zero_index(key):
            key = ()  # MAX 26.7 lets ``s[0] = v`` set a rank-0 buffer's element
        _check_single_element(key, self.shape)
        view, flips = self._resolve(key)
        if isinstance(value, np.generic):
            value = value.item()
        if self._dtype in BIT_STORED and not isinstance(value, Buffer):
            # no torch arithmetic for these types: convert on the host, assign the bit patterns
            value = np.asarray(value).astype(self._dtype.to_numpy())
        if isinstance(value, (numbers.Number, bool)) and not isinstance(value, complex):
            try:
                view.fill_(value)
            except RuntimeError as e:
                raise ValueError(f"cannot assign {value!r} to a {self.dtype} buffer: {e}") from None
            return
        if isinstance(value, Buffer):
            src = value._torch()
        elif isinstance(value, torch.Tensor):
            src = value.detach()
        elif isinstance(value, (np.ndarray, list, tuple)):
            arr, dt = _np_dtype(np.asarray(value), "Buffer.__setitem__")
            src = _share_numpy(np.ascontiguousarray(arr) if arr.ndim else arr, dt)[0]
        else:
            raise TypeError(
                "Buffer.__setitem__: value must be a number, Buffer, numpy array or torch tensor, "
                f"got {type(value).__name__}"
            )
        if src.device != view.device:
            src = src.to(view.device)
        while src.dim() > view.dim() and src.shape[0] == 1:
            src = src[0]
        try:
            if view.numel() and src.numel() and (
                src.untyped_storage().data_ptr() == view.untyped_storage().data_ptr()
            ):
                src = src.clone()
            if flips:
                src = _tflip(src.expand(view.shape), flips)
            view.copy_(src)
        except RuntimeError as e:
            raise ValueError(
                f"cannot assign a value of shape {tuple(src.shape)} to buffer[{key!r}] "
                f"of shape {tuple(view.shape)}: {e}"
            ) from None

    def __len__(self) -> int:
        if self._t.dim() == 0:
            raise TypeError("len() of a rank-0 buffer")
        return self._t.shape[0]

    def __iter__(self) -> Iterator["Buffer"]:
        if self._t.dim() == 0:
            raise TypeError("iteration over a rank-0 buffer")
        for i in range(self._t.shape[0]):
            yield self[i]

    def __repr__(self) -> str:
        # MAX's form: max.driver.Buffer(DType.int8, (4,), cpu[0])
        dev = self.device
        return f"max.driver.{type(self).__name__}({self._dtype}, {self.shape}, {dev.label}[{dev.id}])"

    def __str__(self) -> str:
        # MAX's form: Buffer([0 0 0 0], dtype=DType.int8, shape=(4,), device=Device(type=cpu,id=0))
        try:
            values = str(self.to_numpy())
        except Exception:  # noqa: BLE001 - a dtype numpy cannot show: the header alone
            values = "..."
        return f"Buffer({values}, dtype={self._dtype}, shape={self.shape}, device={self.device!r})"

    def __reduce__(self):
        return (_rebuild, (self._t, self._flip, self._ro))


def _is_zero_index(key: Any) -> bool:
    k = key[0] if isinstance(key, tuple) and len(key) == 1 else key
    return not isinstance(k, (bool, np.bool_, tuple)) and hasattr(k, "__index__") and operator.index(k) == 0


def _check_single_element(key: Any, shape: tuple) -> None:
    items = key if isinstance(key, tuple) else (key,)
    if len(shape) == 0 and items in ((), (Ellipsis,)):
        return
    ok = len(items) == len(shape) and all(
        not isinstance(k, (bool, np.bool_)) and hasattr(k, "__index__") for k in items)
    if not ok:
        raise ValueError(
            f"Buffer.__setitem__: index {key!r} selects more than one element of a buffer of shape {shape}; "
            "setting items across several indices is not supported (give an integer for every dim, or "
            "copy a block with buf[...].inplace_copy_from(src))"
        )


def _rebuild(t: torch.Tensor, flip: Optional[tuple], ro: bool) -> Buffer:
    return _wrap(t, flip, ro)


def _parse_ctor(args: tuple, kwargs: dict, who: str = "Buffer"):
    """Sort the Buffer constructor's overloads into (data, dtype, shape, device, stream, pinned)."""
    allowed = {"dtype", "shape", "device", "stream", "pinned"}
    for k in kwargs:
        if k not in allowed:
            raise TypeError(f"{who}() got an unexpected keyword argument {k!r}")
    vals: dict = {}
    if args:
        first = args[0]
        if (
            isinstance(first, np.ndarray)
            and "dtype" not in kwargs
            and (len(args) < 2 or not isinstance(args[1], DType))
        ):
            if len(args) > 2:
                raise TypeError(f"{who}(ndarray, device) takes 2 positional arguments, got {len(args)}")
            device = args[1] if len(args) > 1 else kwargs.get("device")
            if {"shape", "stream", "pinned"} & kwargs.keys():
                raise TypeError(f"{who}(ndarray, device) accepts no shape/stream/pinned arguments")
            return first, None, None, _check_device(device, who), None, False
        order = ("dtype", "shape") if isinstance(first, DType) else ("shape", "dtype")
        order = order + ("device", "pinned")
        if len(args) > 4:
            raise TypeError(f"{who}() takes at most 4 positional arguments, got {len(args)}")
        for name, v in zip(order, args):
            if name == "device" and isinstance(v, DeviceStream):
                name = "stream"
            if name in kwargs:
                raise TypeError(f"{who}() got multiple values for argument {name!r}")
            vals[name] = v
    vals.update(kwargs)
    for req in ("dtype", "shape"):
        if req not in vals:
            raise TypeError(f"{who}() missing required argument {req!r}")
    dtype = _check_dtype(vals["dtype"], who)
    shape = _check_shape(vals["shape"], who)
    stream = vals.get("stream")
    device = vals.get("device")
    if isinstance(device, DeviceStream) and stream is None:
        device, stream = None, device
    if stream is not None:
        if not isinstance(stream, DeviceStream):
            raise TypeError(f"{who}: stream must be a DeviceStream, got {type(stream).__name__} {stream!r}")
        if device is not None and device != stream.device:
            raise ValueError(f"{who}: device {device} does not match the stream's device {stream.device}")
        device = stream.device
    device = _check_device(device, who)
    pinned = vals.get("pinned", False)
    if not isinstance(pinned, (bool, np.bool_)):
        raise TypeError(f"{who}: pinned must be a bool, got {type(pinned).__name__} {pinned!r}")
    return None, dtype, shape, device, stream, bool(pinned)


def _memmap(filename, dtype, shape, mode, offset, who):
    dtype = _check_dtype(dtype, who)
    shape = _check_shape(shape, who)
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
        raise ValueError(f"{who}: offset must be a non-negative int, got {offset!r}")
    npd = dtype.to_numpy()
    try:
        mm = np.memmap(filename, dtype=npd, mode=mode, offset=int(offset), shape=shape)
    except ValueError as e:
        raise ValueError(f"{who}({os.fspath(filename)!r}, {dtype}, {shape}, mode={mode!r}): {e}") from None
    t, _, ro, _ = _share_numpy(mm, dtype)
    return t, ro or mode in ("r", "readonly"), dtype


class MemMapTensor(Buffer):
    """A buffer over a memory-mapped file (older API; ``np.memmap`` semantics, default mode ``'r+'``).

    Slicing a MemMapTensor gives plain ``Buffer`` views of the same mapping.
    """

    __slots__ = ("_mode",)

    def __init__(
        self,
        filename: "os.PathLike[str] | str",
        dtype: DType,
        shape: Any,
        mode: str = "r+",
        offset: int = 0,
    ) -> None:
        t, ro, dt = _memmap(filename, dtype, shape, mode, offset, "MemMapTensor")
        self._t = t
        self._dtype = dt
        self._stream = None
        self._flip = None
        self._ro = ro
        self._mode = mode

    @property
    def read_only(self) -> bool:
        """True when the mapping was opened read-only (mode ``'r'``)."""
        return self._ro


Tensor = Buffer
