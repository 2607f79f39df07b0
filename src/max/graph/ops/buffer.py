"""Mutable buffers: ``buffer_create``, ``buffer_load``, ``buffer_store``, ``buffer_store_slice``.

Every buffer op consumes the graph's current chain and produces the next one,
so loads and stores of one buffer run in program order and are never merged,
reordered or removed by the compiler.
"""

from __future__ import annotations

import builtins

from typing import Any

from max.graph.ops._common import as_tensor, broadcast_shapes, current_graph, fail
from max.graph.ops.elementwise import cast
from max.graph.dim import StaticDim
from max.graph.type import BufferType, _ChainType
from max.graph.value import BufferValue, TensorValue

__all__ = ["buffer_create", "buffer_load", "buffer_store", "buffer_store_slice"]


def _buffer(x: Any, op: str, arg: str) -> BufferValue:
    if not isinstance(x, BufferValue):
        fail(op, f"{arg} must be a BufferValue (a BufferType graph input), got {type(x).__name__}", TypeError)
    return x


def _chained(op: str, operands: list, result_types: list, attrs: dict | None = None) -> list:
    g = current_graph(op)
    res = g._add_node(op, operands + [g._current_chain], result_types + [_ChainType()], attrs or {},
                      side_effects=True)
    g._current_chain = res[-1]
    return res[:-1]


def buffer_create(type: Any) -> BufferValue:  # noqa: A002 - reference name
    """A new zero-filled buffer of ``type`` (a :class:`BufferType` with static dims) owned by the graph.

    Each call creates a distinct buffer (never merged with another by the compiler).
    """
    op = "buffer_create"
    if not isinstance(type, BufferType):
        fail(op, f"type must be a BufferType, got {builtins.type(type).__name__} {type!r}", TypeError)
    for d in type.shape:
        if not isinstance(d, StaticDim):
            fail(op, f"type {type} has symbolic dim {d}; a created buffer needs static dims")
    g = current_graph(op)
    (b,) = g._add_node(op, [], [type], {"shape": type.shape, "dtype": type.dtype, "device": type.device},
                       side_effects=True)
    return b


def buffer_load(x: Any) -> TensorValue:
    """A value-semantic copy of the buffer's current contents."""
    b = _buffer(x, "buffer_load", "x")
    (v,) = _chained("buffer_load", [b], [b.type.as_tensor()])
    return v


def _store_source(source: Any, shape: Any, b: BufferValue, op: str) -> TensorValue:
    src = as_tensor(source, op=op, arg="source", dtype=b.dtype, device=b.device)
    if src.device != b.device:
        fail(op, f"source is on {src.device}, the buffer on {b.device}")
    if src.dtype is not b.dtype:
        if not (src._node.op == "constant"):
            fail(op, f"source has dtype {src.dtype}, the buffer {b.dtype}; cast it first", TypeError)
        src = cast(src, b.dtype)
    if broadcast_shapes(src.shape, shape, op, "source and destination") != shape:
        fail(op, f"source shape {src.shape} does not broadcast to the destination shape {shape}")
    return src


def buffer_store(destination: Any, source: Any) -> None:
    """Copy ``source`` into the buffer ``destination`` (shapes broadcast; dtypes must match)."""
    op = "buffer_store"
    b = _buffer(destination, op, "destination")
    src = _store_source(source, b.shape, b, op)
    _chained(op, [b, src], [])


def buffer_store_slice(destination: Any, source: Any, indices: Any) -> None:
    """Copy ``source`` into ``destination[indices]`` (NumPy indexing, as ``ops.slice_tensor``)."""
    op = "buffer_store_slice"
    from max.graph.ops.indexing import slice_tensor

    b = _buffer(destination, op, "destination")
    g = current_graph(op)
    # The index is normalised by slice_tensor's type rule (one definition of
    # indexing), applied to a stand-in value of the buffer's type.
    probe = g._new_block(f"{op}.index", [b.type.as_tensor()])
    with probe:
        view = slice_tensor(probe.inputs[0], indices)
    if view is probe.inputs[0]:
        attrs: dict = {"index": (slice(None),) * b.rank}
        operands: list = []
    else:
        node = view._node
        attrs = {k: v for k, v in node.attrs.items() if not k.startswith("_")}
        operands = list(node.inputs[1:])
        if attrs.get("adv_front"):
            fail(op, "this mix of tensor indices and `...` is not supported for stores; index with "
                     "adjacent tensor indices instead")
        if attrs.get("flip"):
            fail(op, "negative-step slices cannot be stored into; store a flipped source into a positive-step slice")
    src = _store_source(source, view.shape, b, op)
    _chained(op, [b, src] + operands, [], attrs)
