"""Collective ops over per-device tensors: ``allgather`` (and ``allreduce_sum``).

Each collective takes one tensor per device and one signal buffer per device
(``BufferValue`` s; the reference's GPU kernels use them to synchronise
peers) and returns one result per input, on that input's device.  Here the
data moves with torch device-to-device copies, so the signal buffers are
checked (one per input, on the input's device) but not otherwise used.

A single input is the degenerate case (the result is a copy of it).
Several inputs on the same device are accepted too (each gets its own
result tensor), which lets CPU-only graphs exercise the collectives.
``group_size`` splits the inputs into consecutive groups of that many
devices, each reduced or gathered on its own (None: one group of all).

A signal that is not a ``BufferValue`` is MAX's TypeError (``BufferValue()
argument must be ... not 'TensorValue'``), except on eager tensors
(``max.experimental``, whose compute graph sets ``_eager_signals``): there
any tensor may stand for a signal buffer, as in MAX's
``F.functional(ops.allgather)([t], [signal])``.

``allreduce_sum`` (also reachable as ``ops.allreduce.sum``) is not in the
reference's text for ``max.graph.ops``; it is provided because its
tensor-parallel layers (row-parallel linears, distributed transformers)
need an all-reduce, with the same conventions as ``allgather``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Iterable

from max.graph.ops._common import as_tensor, current_graph, fail, normalize_axis, stage
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
    eager = getattr(current_graph(op), "_eager_signals", False)
    for i, (x, s) in enumerate(zip(xs, sigs)):
        if not isinstance(s, BufferValue) and not (eager and isinstance(s, TensorValue)):
            raise TypeError(f"BufferValue() argument must be an mlir.Value of buffer type or a graph.BufferValue, "
                            f"not '{type(s).__name__}' ({op}: signal_buffers[{i}])")
        if s.device != x.device:
            fail(op, f"signal_buffers[{i}] is on {s.device} but inputs[{i}] is on {x.device}")
    for i, x in enumerate(xs[1:], 1):
        if x.dtype is not xs[0].dtype:
            fail(op, f"inputs[{i}] has dtype {x.dtype}, inputs[0] has {xs[0].dtype}", TypeError)
        if x.rank != xs[0].rank:
            fail(op, f"inputs[{i}] has rank {x.rank} ({x.shape}), inputs[0] has rank {xs[0].rank} ({xs[0].shape})")
    return xs


def _groups(op: str, xs: list[TensorValue], group_size: Any) -> list[list[TensorValue]]:
    if group_size is None:
        return [xs]
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        fail(op, f"group_size must be a positive int or None, got {group_size!r}", TypeError)
    if len(xs) % group_size:
        fail(op, f"group_size={group_size} does not divide the {len(xs)} inputs into equal groups")
    return [xs[i:i + group_size] for i in range(0, len(xs), group_size)]


def _stage(op: str, xs: list[TensorValue], shape: Shape, attrs: dict) -> list[TensorValue]:
    devices = tuple(x.device for x in xs)
    types = [TensorType(xs[0].dtype, shape, d) for d in devices]
    return list(stage(op, xs, types, {**attrs, "devices": devices, "_multi": True}))


def allgather(inputs: Iterable[Any], signal_buffers: Iterable[BufferValue], axis: int = 0,
              group_size: int | None = None) -> list[TensorValue]:
    """Concatenate the per-device ``inputs`` along ``axis`` (within each group of ``group_size``
    devices); every input's device gets its group's result.

    All inputs need the same dtype and rank, and equal dims except along
    ``axis``.  Raises ValueError for mismatched shapes, signal buffers or
    group sizes, TypeError for non-tensors, non-buffer signals or mixed
    dtypes, IndexError for a bad axis.
    """
    op = "allgather"
    xs = _operands(op, inputs, signal_buffers)
    a = normalize_axis(axis, xs[0].rank, op)
    for i, x in enumerate(xs[1:], 1):
        for j, (d0, d) in enumerate(zip(xs[0].shape, x.shape)):
            if j != a and d0 != d:
                fail(op, f"inputs[{i}] {x.shape} and inputs[0] {xs[0].shape} differ in dim {j} "
                         f"(only the gather axis {a} may differ)")
    out: list[TensorValue] = []
    for group in _groups(op, xs, group_size):
        total = group[0].shape[a]
        for x in group[1:]:
            total = total + x.shape[a]
        shape = Shape([total if j == a else d for j, d in enumerate(group[0].shape)])
        out.extend(_stage(op, group, shape, {"axis": a}))
    return out


def allreduce_sum(inputs: Iterable[Any], signal_buffers: Iterable[BufferValue],
                  group_size: int | None = None) -> list[TensorValue]:
    """The elementwise sum of the per-device ``inputs`` (equal shapes) within each group of
    ``group_size`` devices, on every input's device."""
    op = "allreduce_sum"
    xs = _operands(op, inputs, signal_buffers)
    for i, x in enumerate(xs[1:], 1):
        if x.shape != xs[0].shape:
            fail(op, f"inputs[{i}] has shape {x.shape}, inputs[0] has {xs[0].shape}; they must be equal")
    out: list[TensorValue] = []
    for group in _groups(op, xs, group_size):
        out.extend(_stage(op, group, Shape(xs[0].shape), {}))
    return out


allreduce = SimpleNamespace(sum=allreduce_sum)
