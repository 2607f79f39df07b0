"""Linear algebra: ``matmul`` and ``outer``."""

from __future__ import annotations

from typing import Any

from max.graph.ops._common import as_tensor, broadcast_shapes, fail, promote_operands, same_device, stage1
from max.graph.ops.elementwise import cast
from max.graph.shape import Shape
from max.graph.type import TensorType
from max.graph.value import TensorValue


def matmul(lhs: Any, rhs: Any) -> TensorValue:
    """Matrix product of the last two dims; batch dims broadcast.

    A 1-D ``lhs`` is treated as ``1 x K`` and a 1-D ``rhs`` as ``K x 1``; the
    added dims are dropped from the result.
    """
    op = "matmul"
    a = as_tensor(lhs, op=op, arg="lhs")
    b = as_tensor(rhs, op=op, arg="rhs")
    dev = same_device(op, a, b, labels=("lhs", "rhs"))
    if a.rank == 0 or b.rank == 0:
        fail(op, f"operands must have rank >= 1, got lhs {a.shape} and rhs {b.shape}")
    sa = Shape([1]) + a.shape if a.rank == 1 else a.shape
    sb = b.shape + Shape([1]) if b.rank == 1 else b.shape
    k1, k2 = sa[-1], sb[-2]
    if k1 != k2:
        fail(op, f"lhs {a.shape} and rhs {b.shape}: inner dimensions {k1} and {k2} differ")
    batch = broadcast_shapes(sa[:-2], sb[:-2], op, "batch")
    out = list(batch)
    if a.rank > 1:
        out.append(sa[-2])
    if b.rank > 1:
        out.append(sb[-1])
    dt = promote_operands(op, [("lhs", a), ("rhs", b)])
    if dt.is_float8():
        fail(op, f"float8 operands are not supported by matmul; dequantize first", TypeError)
    a, b = cast(a, dt), cast(b, dt)
    return stage1(op, [a, b], TensorType(dt, out, dev))


def outer(lhs: Any, rhs: Any) -> TensorValue:
    """Outer product of the flattened operands: shape ``[numel(lhs), numel(rhs)]``."""
    op = "outer"
    a = as_tensor(lhs, op=op, arg="lhs")
    b = as_tensor(rhs, op=op, arg="rhs")
    dev = same_device(op, a, b, labels=("lhs", "rhs"))
    dt = promote_operands(op, [("lhs", a), ("rhs", b)])
    a, b = cast(a, dt), cast(b, dt)
    na = a.type.num_elements()
    nb = b.type.num_elements()
    return stage1(op, [a, b], TensorType(dt, [na, nb], dev))
