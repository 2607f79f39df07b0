"""Casting host/device buffers between dtypes: ``cast_tensor_to``, ``cast_tensors_to``, ``cast_dlpack_to``.

Conversions round to nearest (even) like a graph ``cast``; bfloat16, the float8 kinds and
float4/float6 are supported (the last two through ``ml_dtypes`` on the host).  The result
is a new ``driver.Buffer`` on the source's device (``cast_dlpack_to``: on ``device``); a
buffer that already has the dtype (and device) is returned as it is.  The signatures are MAX 26.7's.

``session=`` (an ``InferenceSession``): the cast runs as a compiled graph (one ``ops.cast``) in that
session, on the target device; the compiled cast is kept per session, dtype pair, rank and device.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import numpy as np
import torch

from max.driver import Buffer, Device
from max.dtype import DType, torch_storage_dtype
from max.dtype.dtype import BIT_STORED

__all__ = ["cast_dlpack_to", "cast_tensor_to", "cast_tensors_to"]


def _check_dtype(dtype: Any, who: str) -> DType:
    if not isinstance(dtype, DType):
        raise TypeError(f"{who}: dtype must be a max.dtype.DType, got {type(dtype).__name__} {dtype!r}")
    return dtype


_SESSION_CASTS: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def _session_cast(session: Any, tensor: Buffer, dtype: DType, target: Device) -> Buffer:
    """``tensor`` cast to ``dtype`` by a one-op graph compiled in ``session`` (cached per session)."""
    from max.graph import DeviceRef, Graph, TensorType, ops

    if not hasattr(session, "load"):
        raise TypeError(f"cast_tensor_to: session must be an InferenceSession, got {type(session).__name__}")
    src = tensor if tensor.device == target else tensor.to(target)
    if not src.is_contiguous:
        src = src.contiguous()
    key = (src.dtype, dtype, src.rank, target.label, target.id)
    try:
        cache = _SESSION_CASTS.setdefault(session, {})
    except TypeError:  # a session that cannot be weakly referenced: no cache
        cache = {}
    model = cache.get(key)
    if model is None:
        ref = DeviceRef.from_device(target)
        shape = [f"cast_d{i}" for i in range(src.rank)]
        with Graph(f"cast_{src.dtype.name}_to_{dtype.name}", input_types=[TensorType(src.dtype, shape, ref)]) as g:
            g.output(ops.cast(g.inputs[0].tensor, dtype))
        model = cache[key] = session.load(g)
    return model.execute(src)[0]


def _cast(tensor: Buffer, dtype: DType, target: Device, session: Any) -> Buffer:
    if tensor.dtype is dtype:
        return tensor if target == tensor.device else tensor.to(target)
    if session is not None:
        return _session_cast(session, tensor, dtype, target)
    if tensor.dtype in BIT_STORED or dtype in BIT_STORED:
        arr = tensor.to_numpy().astype(np.float32).astype(dtype.to_numpy())
        out = Buffer.from_numpy(np.ascontiguousarray(arr))
        return out if target.is_host else out.to(target)
    t = tensor._torch().to(torch_storage_dtype(dtype))
    out = Buffer._from_torch(t.contiguous())
    return out if target == out.device else out.to(target)


def cast_tensor_to(tensor: Buffer, new_dtype: DType, session: Any = None) -> Buffer:
    """``tensor``'s values as ``new_dtype``, on its device (a new buffer; the same one when the dtype
    already matches); with ``session`` (an ``InferenceSession``), cast by a graph compiled in it."""
    if not isinstance(tensor, Buffer):
        raise TypeError(f"cast_tensor_to: expected a driver.Buffer, got {type(tensor).__name__}")
    new_dtype = _check_dtype(new_dtype, "cast_tensor_to")
    return _cast(tensor, new_dtype, tensor.device, session)


def cast_tensors_to(tensors: Sequence[Buffer] | None, new_dtype: DType, session: Any = None) -> list[Buffer]:
    """:func:`cast_tensor_to` for each buffer (``[]`` for None)."""
    if tensors is None:
        return []
    return [cast_tensor_to(t, new_dtype, session) for t in tensors]


def cast_dlpack_to(raw_tensor: Any, old_dtype: DType, new_dtype: DType, device: Device,
                   session: Any = None) -> Buffer:
    """A DLPack array (numpy, torch, Buffer...) holding ``old_dtype`` values, cast to ``new_dtype`` on
    ``device``.  When the array's own dtype differs from ``old_dtype`` but has the same size (bfloat16
    bits in a uint16 array, say), its bytes are read as ``old_dtype``."""
    old_dtype = _check_dtype(old_dtype, "cast_dlpack_to")
    new_dtype = _check_dtype(new_dtype, "cast_dlpack_to")
    if not isinstance(device, Device):
        raise TypeError(f"cast_dlpack_to: device must be a driver.Device, got {type(device).__name__} {device!r}")
    if isinstance(raw_tensor, Buffer):
        buf = raw_tensor
    elif isinstance(raw_tensor, np.ndarray):
        buf = Buffer.from_numpy(raw_tensor)
    elif isinstance(raw_tensor, torch.Tensor):
        buf = Buffer._from_torch(raw_tensor.detach().contiguous())
    elif hasattr(raw_tensor, "__dlpack__"):
        buf = Buffer.from_dlpack(raw_tensor)
    else:
        raise TypeError(f"cast_dlpack_to: expected a DLPack array, got {type(raw_tensor).__name__}")
    if buf.dtype is not old_dtype:
        if buf.dtype.size_in_bytes != old_dtype.size_in_bytes:
            raise ValueError(f"cast_dlpack_to: the array holds {buf.dtype} ({buf.dtype.size_in_bytes} bytes each), "
                             f"which cannot be read as old_dtype={old_dtype} ({old_dtype.size_in_bytes} bytes)")
        buf = buf.view(old_dtype)
    return _cast(buf, new_dtype, device, session)
