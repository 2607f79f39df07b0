"""Casting host/device buffers between dtypes: ``cast_tensor_to``, ``cast_tensors_to``, ``cast_dlpack_to``.

Conversions round to nearest (even) like a graph ``cast``; bfloat16, the float8 kinds and
float4/float6 are supported (the last two through ``ml_dtypes`` on the host).  The result
is a new ``driver.Buffer`` on the source's device unless ``device`` says otherwise; a
buffer that already has the dtype (and device) is returned as it is.

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


def cast_tensor_to(tensor: Buffer, dtype: DType, device: Device | None = None, *, session: Any = None) -> Buffer:
    """``tensor``'s values as ``dtype`` (a new buffer; the same one when nothing changes); with
    ``session``, cast by a graph compiled in that session."""
    if not isinstance(tensor, Buffer):
        raise TypeError(f"cast_tensor_to: expected a driver.Buffer, got {type(tensor).__name__}")
    dtype = _check_dtype(dtype, "cast_tensor_to")
    if device is not None and not isinstance(device, Device):
        raise TypeError(f"cast_tensor_to: device must be a driver.Device, got {type(device).__name__}")
    target = device if device is not None else tensor.device
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


def cast_tensors_to(tensors: Sequence[Buffer], dtype: DType, device: Device | None = None, *,
                    session: Any = None) -> list[Buffer]:
    """:func:`cast_tensor_to` for each buffer."""
    return [cast_tensor_to(t, dtype, device, session=session) for t in tensors]


def cast_dlpack_to(array: Any, dtype: DType, device: Device | None = None, *, session: Any = None) -> Buffer:
    """A DLPack array (numpy, torch, Buffer...) imported and cast to ``dtype``."""
    if isinstance(array, Buffer):
        buf = array
    elif isinstance(array, np.ndarray):
        buf = Buffer.from_numpy(array)
    elif isinstance(array, torch.Tensor):
        buf = Buffer._from_torch(array.detach().contiguous())
    elif hasattr(array, "__dlpack__"):
        buf = Buffer.from_dlpack(array)
    else:
        raise TypeError(f"cast_dlpack_to: expected a DLPack array, got {type(array).__name__}")
    return cast_tensor_to(buf, dtype, device, session=session)
