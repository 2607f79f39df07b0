"""Creation ops: ``range`` and ``hann_window``.

``range`` with Python numbers has a static length; with ``Dim`` bounds its
length is an algebraic dim (``range(0, Dim("n"))`` has length ``n``); with
tensor bounds the length is data-dependent and must be named with
``out_dim`` (checked, or bound if it is a new symbolic name, at execution).
"""

from __future__ import annotations

import builtins
import math
from typing import Any

import numpy as np

from max.dtype import DType
from max.graph.dim import Dim, StaticDim
from max.graph.ops._common import as_device_ref, as_tensor, fail, stage1
from max.graph.shape import Shape
from max.graph.type import DeviceRef, TensorType
from max.graph.value import TensorValue

__all__ = ["range", "hann_window"]

_NUM = (bool, int, float, np.integer, np.floating, np.bool_)


def _range_arg(v: Any, name: str, op: str) -> Any:
    """A Python number, a Dim, or a rank-0 TensorValue."""
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v.item()
    if isinstance(v, (bool, np.bool_)):
        fail(op, f"{name} must be a number, Dim or scalar tensor, got bool {v!r}", TypeError)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    if isinstance(v, StaticDim):
        return v.dim
    if isinstance(v, Dim):
        return v
    t = as_tensor(v, op=op, arg=name)
    if t.rank != 0:
        fail(op, f"{name} must be a scalar (rank-0) tensor, got {t.type}")
    if t.dtype is DType.bool:
        fail(op, f"{name} must be numeric, got a bool tensor", TypeError)
    return t


def range(  # noqa: A001 - reference name
    start: Any,
    stop: Any,
    step: Any = 1,
    out_dim: Any = None,
    *,
    dtype: DType | None = None,
    device: Any = None,
) -> TensorValue:
    """The 1-D sequence ``start, start + step, ...`` up to (not including) ``stop``.

    Raises ValueError when ``step`` is zero, when ``stop - start`` is non-zero
    and has the sign opposite to ``step`` (static values), when tensor
    arguments come without ``out_dim``, or when a static ``out_dim``
    contradicts the static length.  ``dtype`` defaults to the tensor
    arguments' dtype, else float32; ``device`` defaults to the CPU.
    """
    op = "range"
    args = [_range_arg(v, n, op) for v, n in ((start, "start"), (stop, "stop"), (step, "step"))]
    tensors = [a for a in args if isinstance(a, TensorValue)]
    if len({t.dtype for t in tensors}) > 1:
        fail(op, "tensor arguments must have the same dtype, got "
                 + ", ".join(str(t.dtype) for t in tensors), TypeError)
    if dtype is None:
        dtype = tensors[0].dtype if tensors else DType.float32
    if not isinstance(dtype, DType):
        fail(op, f"dtype must be a DType, got {type(dtype).__name__} {dtype!r}", TypeError)
    dev = as_device_ref(device, op) if device is not None else DeviceRef.CPU()
    s0, s1, st = args
    if isinstance(st, (int, float)) and st == 0:
        fail(op, "step must be non-zero")
    if isinstance(st, Dim):
        fail(op, f"step must be a static number or a tensor, got symbolic dim {st}", TypeError)
    length: Dim | None = None
    if all(isinstance(a, (int, float)) for a in args):
        diff = s1 - s0
        if diff != 0 and (diff > 0) != (st > 0):
            fail(op, f"stop - start ({s1} - {s0} = {diff}) must be zero or have the same sign as step ({st})")
        if all(isinstance(a, int) for a in args):
            n = -((s0 - s1) // st)
        else:
            n = math.ceil(diff / st)
        length = StaticDim(builtins.max(0, n))
    elif not tensors:
        if not isinstance(st, int):
            fail(op, f"step must be an int when start/stop are symbolic dims, got {st!r}", TypeError)
        if any(isinstance(a, float) for a in (s0, s1)):
            fail(op, "start/stop cannot mix symbolic dims and floats", TypeError)
        a, b = Dim(s0), Dim(s1)
        length = (b - a + (st - 1)) // st if st > 0 else (a - b + (-st - 1)) // (-st)
    attrs: dict = {}
    if out_dim is not None:
        try:
            od = Dim(out_dim)
        except (TypeError, ValueError) as e:
            fail(op, f"out_dim {out_dim!r} is not a valid dim: {e}", TypeError)
        if isinstance(length, StaticDim) and isinstance(od, StaticDim) and length != od:
            fail(op, f"out_dim is {od} but range({s0}, {s1}, {st}) has {length} elements")
        if length is None or length != od:
            attrs["_check_shape"] = True
        length = od
    if length is None:
        fail(op, "start/stop/step given as tensors make the length data-dependent; pass out_dim to name it")
    if isinstance(length, StaticDim) and length.dim < 0:
        fail(op, f"out_dim must be non-negative, got {length}")
    if not dtype.is_float() and all(isinstance(a, (int, float)) for a in args):
        # the values must be representable in an integer dtype: whole numbers within its range
        for name, a in (("start", s0), ("step", st)):
            if isinstance(a, float) and not a.is_integer():
                fail(op, f"{name}={a} is not a whole number, but dtype is {dtype}")
        if isinstance(length, StaticDim) and length.dim > 0:
            last = s0 + st * (length.dim - 1)
            info = np.iinfo(dtype.to_numpy()) if dtype is not DType.bool else None
            lo, hi = (0, 1) if info is None else (int(info.min), int(info.max))
            for name, a in (("start", s0), ("last value", last)):
                if not lo <= a <= hi:
                    fail(op, f"{name} {a} of range({s0}, {s1}, {st}) does not fit {dtype} ({lo}..{hi})")
    operands = []
    for key, a in zip(("start", "stop", "step"), args):
        if isinstance(a, TensorValue):
            operands.append(a)
            attrs[key] = None
        else:
            attrs[key] = a
    attrs["dtype"] = dtype
    attrs["device"] = dev
    return stage1(op, operands, TensorType(dtype, Shape([length]), dev), attrs)


def hann_window(
    window_length: int,
    device: Any,
    periodic: bool = True,
    dtype: DType = DType.float32,
) -> TensorValue:
    """A Hann window ``0.5 - 0.5 * cos(2 * pi * n / N)``, ``n < window_length``.

    ``N`` is ``window_length`` when ``periodic`` (so the result equals
    ``hann_window(L + 1, periodic=False)[:-1]``) and ``window_length - 1``
    otherwise (a length-1 symmetric window is ``[1]``).  Raises ValueError
    for a negative length and TypeError for a non-integer one.
    """
    op = "hann_window"
    if isinstance(window_length, (bool, np.bool_)) or not isinstance(window_length, (int, np.integer, StaticDim)):
        fail(op, f"window_length must be an int, got {type(window_length).__name__} {window_length!r}", TypeError)
    n = int(window_length)
    if n < 0:
        fail(op, f"window_length must be non-negative, got {n}")
    if not isinstance(dtype, DType):
        fail(op, f"dtype must be a DType, got {type(dtype).__name__} {dtype!r}", TypeError)
    dev = as_device_ref(device, op)
    return stage1(op, [], TensorType(dtype, [n], dev),
                  {"window_length": n, "periodic": bool(periodic), "dtype": dtype, "device": dev})
