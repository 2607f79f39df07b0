"""Msgpack serialisation of requests, contexts and outputs (with numpy arrays).

Built on ``msgspec``: dataclasses, ``TypedDict``s, enums and builtins are encoded
natively and decoded *into the requested type* (so ``__post_init__`` validation runs
on decode).  Numpy arrays travel as msgpack extension types:

* ext code 1 (in-band): ``u8 len | dtype string | u8 ndim | ndim x u64 shape | raw bytes``
  (C order).  With ``copy=False`` the decoder returns a read-only view into the message.
* ext code 2 (shared memory, ``use_shared_memory=True`` and ``nbytes >= threshold``):
  a msgpack map ``{"__shm__": True, "name", "shape", "dtype"}`` naming a POSIX shared
  memory segment that holds the data.  The decoder copies the data out and unlinks the
  segment, so each encoded message must be decoded exactly once.

Encoders and decoders are picklable (they rebuild their ``msgspec`` objects lazily), so
they can be handed to worker processes.
"""

from __future__ import annotations

import struct
from multiprocessing import shared_memory
from typing import Any, Union

import msgspec
import numpy as np

_EXT_NDARRAY = 1
_EXT_SHM = 2


class SharedMemoryArray:
    """Placeholder for a numpy array stored in shared memory (encoded with a ``__shm__`` flag).

    Decoding turns it back into a numpy array (and unlinks the segment).
    """

    __slots__ = ("name", "shape", "dtype")

    def __init__(self, name: str, shape: tuple[int, ...], dtype: str) -> None:
        self.name = name
        self.shape = tuple(int(d) for d in shape)
        self.dtype = str(dtype)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SharedMemoryArray):
            return NotImplemented
        return (self.name, self.shape, self.dtype) == (other.name, other.shape, other.dtype)

    def __repr__(self) -> str:
        return f"SharedMemoryArray(name={self.name!r}, shape={self.shape}, dtype={self.dtype!r})"

    def to_numpy(self, copy: bool = True) -> np.ndarray:
        """Read the array out of the segment, then unlink the segment."""
        return _read_shm(self.name, tuple(self.shape), self.dtype)


def _dtype_key(dt: np.dtype) -> str:
    if dt.hasobject:
        raise TypeError("msgpack: numpy arrays of dtype object cannot be encoded")
    # ml_dtypes types (bfloat16, float8_*) are kind 'V' and only recoverable by name.
    return dt.name if dt.kind == "V" else dt.str


def _dtype_of(key: str) -> np.dtype:
    try:
        return np.dtype(key)
    except TypeError:
        import ml_dtypes  # noqa: F401  (registers bfloat16 / float8 with numpy)

        return np.dtype(getattr(ml_dtypes, key))


def _open_shm(name: str | None = None, size: int = 0) -> shared_memory.SharedMemory:
    """Open (or create) a segment whose lifetime this module manages explicitly.

    Python's resource tracker would otherwise unlink segments created here when the
    producer exits (before a consumer read them) and warn about them; Python >= 3.13
    has ``track=False`` for that, older versions need the registration undone.
    """
    create = name is None
    try:
        return shared_memory.SharedMemory(name=name, create=create, size=size, track=False)  # type: ignore[call-arg]
    except TypeError:  # Python < 3.13: no ``track``; creating and attaching both register
        shm = shared_memory.SharedMemory(name=name, create=create, size=size)
        from multiprocessing import resource_tracker

        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
        return shm


def _unlink_shm(shm: shared_memory.SharedMemory) -> None:
    posix = getattr(shared_memory, "_posixshmem", None)
    if posix is not None:  # unlink without telling a resource tracker that never tracked it
        posix.shm_unlink(shm._name)  # type: ignore[attr-defined]
    else:  # pragma: no cover - Windows: segments vanish with their last handle
        pass


def _write_shm(arr: np.ndarray) -> SharedMemoryArray:
    shm = _open_shm(size=max(1, arr.nbytes))
    try:
        np.ndarray(arr.shape, dtype=arr.dtype, buffer=shm.buf)[...] = arr
    finally:
        shm.close()
    return SharedMemoryArray(name=shm.name, shape=tuple(int(d) for d in arr.shape), dtype=_dtype_key(arr.dtype))


def _read_shm(name: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    shm = _open_shm(name)
    try:
        out = np.ndarray(shape, dtype=_dtype_of(dtype), buffer=shm.buf).copy()
    finally:
        shm.close()
        _unlink_shm(shm)
    return out


def _pack_array(arr: np.ndarray) -> bytes:
    if not arr.flags.c_contiguous:  # (np.ascontiguousarray would turn 0-d into 1-d)
        arr = arr.copy(order="C")
    key = _dtype_key(arr.dtype).encode()
    head = struct.pack(f"<B{len(key)}sB{arr.ndim}Q", len(key), key, arr.ndim, *arr.shape)
    return head + arr.tobytes()


def _unpack_array(data: memoryview, copy: bool) -> np.ndarray:
    n = data[0]
    key = bytes(data[1 : 1 + n]).decode()
    ndim = data[1 + n]
    off = 2 + n
    shape = struct.unpack_from(f"<{ndim}Q", data, off)
    off += 8 * ndim
    dt = _dtype_of(key)
    count = int(np.prod(shape, dtype=np.int64)) if ndim else 1
    arr = np.frombuffer(data, dtype=dt, count=count, offset=off).reshape(shape)
    return arr.copy() if copy else arr


class MsgpackNumpyEncoder:
    """Callable ``obj -> bytes`` (picklable).  See the module docstring for the array format."""

    def __init__(self, use_shared_memory: bool = False, shared_memory_threshold: int = 0) -> None:
        if shared_memory_threshold < 0:
            raise ValueError(f"shared_memory_threshold must be >= 0, got {shared_memory_threshold}")
        self.use_shared_memory = bool(use_shared_memory)
        self.shared_memory_threshold = int(shared_memory_threshold)
        self._encoder: msgspec.msgpack.Encoder | None = None

    def _enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            if self.use_shared_memory and obj.nbytes >= self.shared_memory_threshold and obj.nbytes > 0:
                return self._enc_hook(_write_shm(obj))
            return msgspec.msgpack.Ext(_EXT_NDARRAY, _pack_array(obj))
        if isinstance(obj, SharedMemoryArray):
            payload = {"__shm__": True, "name": obj.name, "shape": list(obj.shape), "dtype": obj.dtype}
            return msgspec.msgpack.Ext(_EXT_SHM, msgspec.msgpack.encode(payload))
        if isinstance(obj, np.generic):
            return obj.item()
        raise NotImplementedError(f"msgpack: cannot encode objects of type {type(obj).__name__}")

    def __call__(self, obj: Any) -> bytes:
        if self._encoder is None:
            self._encoder = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)
        try:
            return self._encoder.encode(obj)
        except NotImplementedError as e:  # pragma: no cover - msgspec wraps hook errors
            raise TypeError(str(e)) from None

    def __getstate__(self) -> dict:
        return {"use_shared_memory": self.use_shared_memory, "shared_memory_threshold": self.shared_memory_threshold}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)  # type: ignore[misc]


def _is_ndarray_type(t: Any) -> bool:
    return t is np.ndarray or getattr(t, "__origin__", None) is np.ndarray


class MsgpackNumpyDecoder:
    """Callable ``bytes -> type_`` (picklable).  ``copy=False`` returns arrays that view the input bytes."""

    def __init__(self, type_: Any, copy: bool = True) -> None:
        self.type_ = type_
        self.copy = bool(copy)
        self._decoder: msgspec.msgpack.Decoder | None = None

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        if code == _EXT_NDARRAY:
            return _unpack_array(data, self.copy)
        if code == _EXT_SHM:
            meta = msgspec.msgpack.decode(data)
            if not isinstance(meta, dict) or not meta.get("__shm__"):
                raise ValueError("msgpack: malformed shared-memory array payload")
            return _read_shm(meta["name"], tuple(meta["shape"]), meta["dtype"])
        raise ValueError(f"msgpack: unknown extension type code {code}")

    def _dec_hook(self, type_: Any, obj: Any) -> Any:
        if _is_ndarray_type(type_):
            if isinstance(obj, np.ndarray):
                return obj
            if isinstance(obj, list):
                return np.asarray(obj)
        if type_ is SharedMemoryArray and isinstance(obj, np.ndarray):
            return obj
        raise NotImplementedError(f"msgpack: cannot decode {type(obj).__name__} into {type_!r}")

    def __call__(self, data: Union[bytes, bytearray, memoryview]) -> Any:
        if self._decoder is None:
            self._decoder = msgspec.msgpack.Decoder(self.type_, dec_hook=self._dec_hook, ext_hook=self._ext_hook)
        return self._decoder.decode(data)

    def __getstate__(self) -> dict:
        return {"type_": self.type_, "copy": self.copy}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)  # type: ignore[misc]


def msgpack_numpy_encoder(use_shared_memory: bool = False, shared_memory_threshold: int = 0) -> MsgpackNumpyEncoder:
    """A picklable encoder ``obj -> bytes`` that handles numpy arrays.

    Args:
        use_shared_memory: Put arrays in POSIX shared memory instead of the message.
        shared_memory_threshold: Minimum array size in bytes for shared memory; 0 means
            every (non-empty) array.
    """
    return MsgpackNumpyEncoder(use_shared_memory, shared_memory_threshold)


def msgpack_numpy_decoder(type_: Any, copy: bool = True) -> MsgpackNumpyDecoder:
    """A picklable decoder ``bytes -> type_``; ``copy`` copies numpy arrays out of the message."""
    return MsgpackNumpyDecoder(type_, copy)


def msgpack_eq(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` encode to the same msgpack bytes (test helper)."""
    enc = MsgpackNumpyEncoder()
    return enc(a) == enc(b)
