"""Shape ops: reshape and friends."""

from __future__ import annotations

from typing import Any

from max.dtype import DType
from max.graph.dim import Dim, StaticDim
from max.graph.ops._common import as_shape, as_tensor, fail, stage1
from max.graph.shape import Shape
from max.graph.type import DeviceRef, TensorType
from max.graph.value import TensorValue


def _num_elements(shape: Shape) -> Dim:
    n: Dim = StaticDim(1)
    for d in shape:
        n = n * d
    return n


def reshape(x: Any, shape: Any) -> TensorValue:
    """Same elements in row-major order, new shape; one ``-1`` is inferred.

    Raises ValueError when the element counts differ.
    """
    op = "reshape"
    x = as_tensor(x, op=op)
    raw = list(shape) if not isinstance(shape, Shape) else list(shape)
    minus = [i for i, d in enumerate(raw) if (isinstance(d, (int,)) and not isinstance(d, bool) and d == -1)
             or (isinstance(d, StaticDim) and d.dim == -1)]
    if len(minus) > 1:
        fail(op, f"at most one -1 is allowed in the target shape, got {raw}")
    total = _num_elements(x.shape)
    if minus:
        rest = [d for i, d in enumerate(raw) if i != minus[0]]
        known = _num_elements(as_shape(rest, op))
        if known == 0:
            fail(op, f"cannot infer -1 in {raw}: the other dims have zero elements")
        inferred = total // known
        if inferred * known != total:
            fail(op, f"cannot reshape {x.shape} ({total} elements) to {raw}: {total} is not divisible by {known}")
        raw[minus[0]] = inferred
    target = as_shape(raw, op)
    for d in target:
        if isinstance(d, StaticDim) and d.dim < 0:
            fail(op, f"dims must be non-negative (or a single -1), got {raw}")
    if _num_elements(target) != total:
        fail(op, f"cannot reshape {x.shape} ({total} elements) to {target} ({_num_elements(target)} elements)")
    if target == x.shape:
        return x
    return stage1(op, [x], TensorType(x.dtype, target, x.device), {"shape": target})


def shape_to_tensor(shape: Any) -> TensorValue:
    """A 1-D int64 tensor holding the (possibly symbolic) dims of ``shape``."""
    shp = as_shape(shape, "shape_to_tensor")
    return stage1(
        "shape_to_tensor", [], TensorType(DType.int64, [len(shp)], DeviceRef.CPU()), {"shape": shp}
    )
