"""Collective ops over per-device tensors: ``allgather`` (and ``allreduce_sum``).

Each collective takes one tensor per device and one signal buffer per device
(``BufferValue`` s; the reference's GPU kernels use them to synchronise
peers) and returns one result per input, on that input's device.  Here the
data moves with torch device-to-device copies, so the signal buffers are
checked (one per input, on the input's device) but not otherwise used.

A single input is the degenerate case (the result is a copy of it).
Several inputs on the same device are accepted too (each gets its own
result tensor), which lets CPU-only graphs exercise the collectives.

``allreduce_sum`` (also reachable as ``ops.allreduce.sum``) is not in the
reference's text for ``max.graph.ops``; it is provided because its
tensor-parallel layers (row-parallel linears, distributed transformers)
need an all-reduce, with the same conventions as ``allgather``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Iterable

from max.graph.ops._common import as_tensor, fail, normalize_axis, stage
from max.graph.shape import Shape
from max.graph.type import TensorType
from max.graph.value import BufferValue, TensorValue

__all__ = ["allgather", "allreduce", "allreduce_sum"]


def _operands(op: str, inputs: Any, signal_buffers: Any) -> list[TensorValue]:
    if isinstance(inputs, TensorValue) or not isinstance(inputs, Iterable):
        fail(op, f"inputs must be an iterable of TensorValues (one per device), got {type(inputs).__name__}",
             TypeError)
    xs = [as_tensor(v, op=op, arg=f"inputs[{i}]") for i, v in enumerate(inputs)]
    if not xs:
        fail(op, "inputs is empty; pass one tensor per device")
    if isinstance(signal_buffers, BufferValue) or not isinstance(signal_buffers, Iterable):
        fail(op, f"signal_buffers must be an iterable of BufferValues (one per device), "
                 f"got {type(signal_buffers).__name__}", TypeError)
    sigs = list(signal_buffers)
    if len(sigs) != len(xs):
        fail(op, f"expected one signal buffer per input: got {len(xs)} inputs and {len(sigs)} signal buffers")
    for i, (x, s) in enumerate(zip(xs, sigs)):
        if not isinstance(s, BufferValue):
            fail(op, f"signal_buffers[{i}] must be a BufferValue, got {type(s).__name__}", TypeError)
        if s.device != x.device:
            fail(op, f"signal_buffers[{i}] is on {s.device} but inputs[{i}] is on {x.device}")
    for i, x in enumerate(xs[1:], 1):
        if x.dtype is not xs[0].dtype:
            fail(op, f"inputs[{i}] has dtype {x.dtype}, inputs[0] has {xs[0].dtype}", TypeError)
        if x.rank != xs[0].rank:
            fail(op, f"inputs[{i}] has rank {x.rank} ({x.shape}), inputs[0] has rank {xs[0].rank} ({xs[0].shape})")
    return xs


def _stage(op: str, xs: list[TensorValue], shape: Shape, attrs: dict) -> list[TensorValue]:
    devices = tuple(x.device for x in xs)
    types = [TensorType(xs[0].dtype, shape, d) for d in devices]
    return list(stage(op, xs, types, {**attrs, "devices": devices, "_multi": True}))


def allgather(inputs: Iterable[Any], signal_buffers: Iterable[BufferValue], axis: int = 0) -> list[TensorValue]:
    """Concatenate the per-device ``inputs`` along ``axis``; every input's device gets the result.

    All inputs need the same dtype and rank, and equal dims except along
    ``axis``.  Raises ValueError for mismatched shapes or signal buffers,
    TypeError for non-tensors or mixed dtypes, IndexError for a bad axis.
    """
    op = "allgather"
    xs = _operands(op, inputs, signal_buffers)
    a = normalize_axis(axis, xs[0].rank, op)
    total = xs[0].shape[a]
    for i, x in enumerate(xs[1:], 1):
        for j, (d0, d) in enumerate(zip(xs[0].shape, x.shape)):
            if j != a and d0 != d:
                fail(op, f"inputs[{i}] {x.shape} and inputs[0] {xs[0].shape} differ in dim {j} "
                         f"(only the gather axis {a} may differ)")
        total = total + x.shape[a]
    shape = Shape([total if j == a else d for j, d in enumerate(xs[0].shape)])
    return _stage(op, xs, shape, {"axis": a})


def allreduce_sum(inputs: Iterable[Any], signal_buffers: Iterable[BufferValue]) -> list[TensorValue]:
    """The elementwise sum of the per-device ``inputs`` (equal shapes), on every input's device."""
    op = "allreduce_sum"
    xs = _operands(op, inputs, signal_buffers)
    for i, x in enumerate(xs[1:], 1):
        if x.shape != xs[0].shape:
            fail(op, f"inputs[{i}] has shape {x.shape}, inputs[0] has {xs[0].shape}; they must be equal")
    return _stage(op, xs, Shape(xs[0].shape), {})


allreduce = SimpleNamespace(sum=allreduce_sum)
