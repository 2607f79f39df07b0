"""Reductions and axis-wise ops: ``sum``, ``mean``, ``prod``, ``max``/``min``
(reduction form), ``argmax``/``argmin``, ``softmax``/``logsoftmax``,
``cumsum``, ``top_k``/``bottom_k`` and ``argsort``.

Type rules:

- Reductions (``sum``, ``mean``, ``prod``, ``max``, ``min``, ``argmax``,
  ``argmin``) keep the rank: the result has the input's shape with ``axis``
  set to 1 (a size-0 axis too, as in MAX: ``[2, 0] -> [2, 1]``).  The default
  axis is -1; negative axes count from the end; an axis out of range raises
  MAX's ValueError ``Invalid axis=5 for input x.rank=2`` (a rank-0 input has
  no axis).  Other dims (symbolic ones included) are kept.  The other ops of
  this family raise IndexError (``Axis out of range ...``) for a bad axis.
- ``sum``, ``prod``, ``max``, ``min`` and ``cumsum`` keep the input dtype
  (integer sums and products wrap around like the dtype does).  ``mean`` keeps the dtype too: for an
  integer input it is the integer sum divided by the axis size, rounded
  toward zero (C integer division); cast to a float type first for a
  fractional mean.  Bool inputs give bool, as in MAX: ``sum`` and ``mean`` are
  "any element true", ``prod`` "every element true" (computed in int32/float32
  and converted back: non-zero is True).  ``cumsum`` rejects bool.
- Over a size-0 axis ``sum`` gives 0, ``prod`` 1 and ``mean`` NaN (NumPy's
  values); ``max``/``min``/``argmax``/``argmin`` build but have no value to
  give, so running them fails.
- ``argmax``/``argmin`` give int64; ties give the first index (on CPU).
- ``softmax``/``logsoftmax`` need a floating-point input (same dtype out).
- ``top_k`` returns ``(values, indices)``: the axis becomes ``k`` (sorted,
  largest first), indices are int64; ``bottom_k`` the same for the ``k``
  smallest (smallest first).  ``k`` must be a static non-negative int,
  at most the axis size when that size is static.
- ``argsort`` sorts along the *first* dimension (as the reference documents)
  and returns int64 indices of the input's shape; ties keep input order.
- float8 inputs are rejected everywhere here (dequantize/cast first).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from max.dtype import DType
from max.graph.dim import Dim, StaticDim
from max.graph.ops._common import as_tensor, fail, normalize_axis, stage, stage1
from max.graph.ops.elementwise import _elementwise_max, _elementwise_min
from max.graph.shape import Shape
from max.graph.type import TensorType
from max.graph.value import TensorValue

__all__ = [
    "argmax",
    "argmin",
    "argsort",
    "bottom_k",
    "prod",
    "cumsum",
    "logsoftmax",
    "max",
    "mean",
    "min",
    "softmax",
    "sum",
    "top_k",
]


def _check_dtype(op: str, x: TensorValue, *, allow_bool: bool = True, float_only: bool = False) -> None:
    dt = x.dtype
    if dt.is_float8():
        fail(op, f"x has dtype {dt}, which {op} does not support; cast it to a wider float type first", TypeError)
    if float_only and not dt.is_float():
        fail(op, f"x must be a floating-point tensor, got {dt}; cast it first (e.g. x.cast(DType.float32))",
             TypeError)
    if not allow_bool and dt is DType.bool:
        fail(op, f"x must be numeric, got {dt}; cast it first (e.g. x.cast(DType.int64))", TypeError)


def _keep_rank(x: TensorValue, axis: int) -> Shape:
    dims = list(x.shape)
    dims[axis] = StaticDim(1)
    return Shape(dims)


def _reduce(op: str, x: Any, axis: Any, *, result_dtype: DType | None = None,
            node: str | None = None) -> TensorValue:
    """Stage keep-rank reduction ``node`` (default: ``op``); errors name ``op``, the public name."""
    x = as_tensor(x, op=op)
    _check_dtype(op, x)
    ax = normalize_axis(axis, x.rank, op, form="reduce")
    if x.dtype is DType.bool and op in ("sum", "prod", "mean"):
        # MAX keeps bool: reduce in a numeric type and convert back (non-zero is True)
        from max.graph.ops.elementwise import cast

        via = DType.float32 if op == "mean" else DType.int32
        return cast(_reduce(op, cast(x, via), ax, node=node), DType.bool)
    out = TensorType(result_dtype or x.dtype, _keep_rank(x, ax), x.device)
    return stage1(node or op, [x], out, {"axis": ax})


def sum(x: Any, axis: int = -1) -> TensorValue:  # noqa: A001 - reference name
    """Sum along ``axis`` (keeps rank; same dtype)."""
    return _reduce("sum", x, axis)


def prod(x: Any, axis: int = -1) -> TensorValue:
    """Product along ``axis`` (keeps rank; same dtype, integer products wrap around)."""
    return _reduce("prod", x, axis)


def mean(x: Any, axis: int = -1) -> TensorValue:
    """Mean along ``axis`` (keeps rank; same dtype, integer means round toward zero)."""
    return _reduce("mean", x, axis)


def max(x: Any, y: Any = None, /, axis: int | None = None) -> TensorValue:  # noqa: A001
    """Elementwise maximum of ``x`` and ``y``; with ``y`` omitted, the maximum along ``axis`` (default -1)."""
    if y is not None:
        return _elementwise_max(x, y)
    return _reduce("max", x, -1 if axis is None else axis, node="reduce_max")


def min(x: Any, y: Any = None, /, axis: int | None = None) -> TensorValue:  # noqa: A001
    """Elementwise minimum of ``x`` and ``y``; with ``y`` omitted, the minimum along ``axis`` (default -1)."""
    if y is not None:
        return _elementwise_min(x, y)
    return _reduce("min", x, -1 if axis is None else axis, node="reduce_min")


def argmax(x: Any, axis: int = -1) -> TensorValue:
    """Index (int64) of the largest value along ``axis`` (keeps rank; first index on ties)."""
    return _reduce("argmax", x, axis, result_dtype=DType.int64)


def argmin(x: Any, axis: int = -1) -> TensorValue:
    """Index (int64) of the smallest value along ``axis`` (keeps rank; first index on ties)."""
    return _reduce("argmin", x, axis, result_dtype=DType.int64)


def _axis_wise(op: str, x: Any, axis: Any) -> TensorValue:
    x = as_tensor(x, op=op)
    _check_dtype(op, x, float_only=True)
    ax = normalize_axis(axis, x.rank, op)
    return stage1(op, [x], x.type, {"axis": ax})


def softmax(x: Any, axis: int = -1) -> TensorValue:
    """``exp(x) / sum(exp(x))`` along ``axis`` (the last one by default); float input."""
    return _axis_wise("softmax", x, axis)


def logsoftmax(x: Any, axis: int = -1) -> TensorValue:
    """``x - log(sum(exp(x)))`` along ``axis`` (the last one by default); float input."""
    return _axis_wise("logsoftmax", x, axis)


def _flag(op: str, name: str, v: Any) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        fail(op, f"{name} must be a bool, got {type(v).__name__} {v!r}", TypeError)
    return bool(v)


def cumsum(x: Any, axis: int = -1, exclusive: bool = False, reverse: bool = False) -> TensorValue:
    """Cumulative sum along ``axis`` (same type as ``x``).

    ``exclusive``: element i sums the elements before i (the first is 0).
    ``reverse``: sums run from the end of the axis toward the front.
    """
    op = "cumsum"
    x = as_tensor(x, op=op)
    _check_dtype(op, x, allow_bool=False)
    ax = normalize_axis(axis, x.rank, op)
    attrs = {"axis": ax, "exclusive": _flag(op, "exclusive", exclusive), "reverse": _flag(op, "reverse", reverse)}
    return stage1(op, [x], x.type, attrs)


def _k_extreme(op: str, input: Any, k: Any, axis: Any) -> tuple[TensorValue, TensorValue]:  # noqa: A002
    x = as_tensor(input, op=op, arg="input")
    _check_dtype(op, x, allow_bool=False)
    ax = normalize_axis(axis, x.rank, op)
    if isinstance(k, StaticDim):
        k = k.dim
    elif isinstance(k, Dim):
        fail(op, f"k must be a static int, got symbolic dim {k}")
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
        fail(op, f"k must be an int, got {type(k).__name__} {k!r}", TypeError)
    k = int(k)
    if k < 0:
        fail(op, f"k must be >= 0, got {k}")
    d = x.shape[ax]
    if isinstance(d, StaticDim) and k > d.dim:
        fail(op, f"k={k} is larger than axis {ax} of input {x.shape} (size {d.dim})")
    dims = list(x.shape)
    dims[ax] = StaticDim(k)
    values_t = TensorType(x.dtype, dims, x.device)
    indices_t = TensorType(DType.int64, dims, x.device)
    values, indices = stage(op, [x], [values_t, indices_t], {"k": k, "axis": ax})
    return values, indices


def top_k(input: Any, k: int, axis: int = -1) -> tuple[TensorValue, TensorValue]:  # noqa: A002
    """The ``k`` largest values along ``axis`` (largest first) and their int64 indices."""
    return _k_extreme("top_k", input, k, axis)


def bottom_k(input: Any, k: int, axis: int = -1) -> tuple[TensorValue, TensorValue]:  # noqa: A002
    """The ``k`` smallest values along ``axis`` (smallest first) and their int64 indices."""
    return _k_extreme("bottom_k", input, k, axis)


def argsort(x: Any, ascending: bool = True) -> TensorValue:
    """Int64 indices that sort ``x`` along its first dimension (stable; same shape as ``x``)."""
    op = "argsort"
    x = as_tensor(x, op=op)
    _check_dtype(op, x, allow_bool=False)
    if x.rank == 0:
        fail(op, "x must have rank >= 1 (it is sorted along its first dimension), got a rank-0 tensor")
    asc = _flag(op, "ascending", ascending)
    return stage1(op, [x], TensorType(DType.int64, x.shape, x.device), {"ascending": asc})
