"""Creation ops: ``range`` and ``hann_window``.

``range`` with Python numbers has a static length (MAX's floored
``(stop - start) // step``); with ``Dim`` bounds its
length is an algebraic dim (``range(0, Dim("n"))`` has length ``n``); with
tensor bounds the length is data-dependent and must be named with
``out_dim`` (checked, or bound if it is a new symbolic name, at execution).
"""

from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from max.dtype import DType
from max.graph.dim import Dim, StaticDim
from max.graph.dtype_promotion import check_weak_scalar
from max.graph.ops._common import as_device_ref, as_tensor, fail, stage1
from max.graph.shape import Shape
from max.graph.type import TensorType
from max.graph.value import TensorValue

__all__ = ["range", "hann_window"]

_NUM = (bool, int, float, np.integer, np.floating, np.bool_)


def _range_arg(v: Any, name: str, op: str) -> Any:
    """A Python number, a Dim, or a rank-0 TensorValue (MAX's ValueErrors for other tensors)."""
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
        raise ValueError(f"range expected scalar values as inputs! ({name} is {t!r})")
    if not t.device.is_cpu():
        raise ValueError(f"Range input values must be on CPU ({name} is on {t.device})")
    if t.dtype is DType.bool:
        fail(op, f"{name} must be numeric, got a bool tensor", TypeError)
    return t


def range(  # noqa: A001 - reference name
    start: Any,
    stop: Any,
    step: Any = 1,
    out_dim: Any = None,
    *,
    dtype: DType,
    device: Any,
) -> TensorValue:
    """The 1-D sequence ``start, start + step, ...``; ``dtype`` and ``device`` are required.

    As in MAX, with Python numbers the length is ``(stop - start) // step`` (floored:
    ``range(0, 5, 2)`` is ``[0, 2]``, a zero step gives an empty range) and the numbers must
    fit ``dtype`` (ValueError ``Unsafe cast: ...``); a length outside int64 is ValueError
    ``Dim value must be -2**63 <= dim < 2**63``.  Tensor arguments must be scalars on the CPU
    and need ``out_dim`` (``Dynamic ranges must provide an explicit out_dim``), which is then
    taken as the length.  With ``Dim`` bounds the length is an algebraic dim.
    """
    op = "range"
    args = [_range_arg(v, n, op) for v, n in ((start, "start"), (stop, "stop"), (step, "step"))]
    tensors = [a for a in args if isinstance(a, TensorValue)]
    if len({t.dtype for t in tensors}) > 1:
        fail(op, "tensor arguments must have the same dtype, got "
                 + ", ".join(str(t.dtype) for t in tensors), TypeError)
    if not isinstance(dtype, DType):
        fail(op, f"dtype must be a DType, got {type(dtype).__name__} {dtype!r}", TypeError)
    dev = as_device_ref(device, op)
    s0, s1, st = args
    if isinstance(st, Dim):
        fail(op, f"step must be a static number or a tensor, got symbolic dim {st}", TypeError)
    length: Dim | None = None
    static_len: int | None = None
    if all(isinstance(a, (int, float)) for a in args):
        n = 0 if st == 0 else (s1 - s0) // st
        static_len = builtins.max(0, int(n))
        length = StaticDim(static_len)
        for name, a in (("start", s0), ("stop", s1), ("step", st)):
            check_weak_scalar(a, dtype, op, name)
    elif not tensors:
        if not isinstance(st, int) or st == 0:
            fail(op, f"step must be a non-zero int when start/stop are symbolic dims, got {st!r}", TypeError)
        if any(isinstance(a, float) for a in (s0, s1)):
            fail(op, "start/stop cannot mix symbolic dims and floats", TypeError)
        a, b = Dim(s0), Dim(s1)
        length = (b - a + (st - 1)) // st if st > 0 else (a - b + (-st - 1)) // (-st)
    attrs: dict = {}
    if out_dim is not None:
        try:
            od = Dim(out_dim)  # ValueError (MAX's) for sizes outside int64 and bad names
        except TypeError as e:
            fail(op, f"out_dim {out_dim!r} is not a valid dim: {e}", TypeError)
        if isinstance(length, StaticDim) and isinstance(od, StaticDim) and length != od:
            fail(op, f"out_dim is {od} but range({s0}, {s1}, {st}) has {length} elements")
        if length is None or length != od:
            attrs["_check_shape"] = True
        length = od
    if length is None:
        raise ValueError("Dynamic ranges must provide an explicit out_dim")
    if isinstance(length, StaticDim) and length.dim < 0:
        fail(op, f"out_dim must be non-negative, got {length}")
    operands = []
    for key, a in zip(("start", "stop", "step"), args):
        if isinstance(a, TensorValue):
            operands.append(a)
            attrs[key] = None
        else:
            attrs[key] = a
    attrs["dtype"] = dtype
    attrs["device"] = dev
    attrs["length"] = static_len
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
