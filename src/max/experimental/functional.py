"""Graph ops that work both while building a ``Graph`` and on eager tensors.

Each op here is ``functional(max.graph.ops.X)``: the same op, defined once in
``max.graph.ops``.  Inside a graph it stages the node (returning a
``TensorValue``); on :class:`~max.experimental.tensor.Tensor` arguments it runs
the op's type rule at the call and then its kernel (or stages it lazily), see
:mod:`max.experimental.tensor`.  The creation helpers (``full``, ``zeros``,
``arange``, ``*_like``...) and ``clamp`` are small compositions of graph ops
made functional the same way; ``cond`` and ``while_loop`` run as Python
control flow on eager tensors and stage the graph ops inside a graph.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from max.dtype import DType
from max.experimental._context import defaults
from max.experimental.tensor import Tensor, functional
from max.graph import ops as _ops
from max.graph.graph import _ACTIVE
from max.graph.type import DeviceRef, TensorType

_OPS = (
    "abs", "acos", "add", "allgather", "allreduce_sum", "argmax", "argmin", "argsort", "as_interleaved_complex",
    "atanh", "avg_pool2d", "band_part", "bottom_k", "broadcast_to", "buffer_store", "buffer_store_slice", "cast",
    "ceil", "chunk", "concat", "constant", "constant_external", "conv2d", "conv2d_transpose", "conv3d", "cos",
    "cumsum", "custom", "div", "equal", "erf", "exp", "flatten", "floor", "floor_div", "fold", "gather",
    "gather_nd", "gelu", "greater", "greater_equal", "group_norm", "hann_window", "inplace_custom", "irfft",
    "is_inf", "is_nan", "layer_norm", "log", "log1p", "logical_and", "logical_not", "logical_or", "logical_xor",
    "logsoftmax", "masked_scatter", "matmul", "max", "max_pool2d", "mean", "min", "mod", "mul", "negate",
    "non_maximum_suppression", "nonzero", "not_equal", "outer", "pad", "permute", "pow", "print", "prod",
    "qmatmul", "range", "relu", "repeat_interleave", "reshape", "resize", "resize_bicubic", "resize_linear",
    "resize_nearest", "rms_norm", "roi_align", "round", "rsqrt", "scatter", "scatter_add", "scatter_max",
    "scatter_min", "scatter_mul", "scatter_nd", "scatter_nd_add", "scatter_nd_max", "scatter_nd_min",
    "scatter_nd_mul", "sigmoid", "silu", "sin", "slice_tensor", "softmax", "split", "sqrt", "squeeze", "stack",
    "sub", "sum", "tanh", "tile", "top_k", "transfer_to", "transpose", "trunc", "unsqueeze", "where",
)

for _name in _OPS:
    globals()[_name] = functional(getattr(_ops, _name))

_transfer_to = transfer_to  # noqa: F821


def transfer_to(x: Any, device: Any) -> Any:  # noqa: F811
    """``x`` on ``device`` (``ops.transfer_to``), or laid out over a mesh when ``device`` is a
    sharding mapping (``max.experimental.sharding.PlacementMapping`` / ``NamedMapping``)."""
    if hasattr(device, "to_placements") and hasattr(device, "mesh"):
        from max.experimental.sharding import distribute

        return distribute(x, device)
    return _transfer_to(x, device)


transfer_to.__wrapped_op__ = _ops.transfer_to  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- creation
def _device_ref(device: Any) -> DeviceRef:
    return device if isinstance(device, DeviceRef) else DeviceRef.from_device(device)


def _in_graph() -> bool:
    from max.experimental._compute import _ComputeIR

    active = _ACTIVE.get()
    return bool(active) and not isinstance(active[-1], _ComputeIR)


def _full(shape: Any, value: Any, *, dtype: DType | None = None, device: Any = None) -> Any:
    dtype, dev = defaults(dtype, device.to_device() if isinstance(device, DeviceRef) else device)
    dims = [int(shape)] if isinstance(shape, int) else list(shape)
    return _ops.broadcast_to(_ops.constant(value, dtype, _device_ref(dev)), dims)


def _like(x: Any) -> TensorType:
    if isinstance(x, TensorType):
        return x
    t = getattr(x, "type", None)
    if isinstance(t, TensorType):
        return t
    raise TypeError(f"expected a tensor, a graph value or a TensorType, got {type(x).__name__} {x!r}")


def _full_like(x: Any, value: Any, *, dtype: DType | None = None, device: Any = None) -> Any:
    t = _like(x)
    return _full(t.shape, value, dtype=dtype or t.dtype, device=device if device is not None else t.device)


full = functional(_full)
full.__name__ = full.__qualname__ = "full"
full.__doc__ = "A tensor of ``shape`` filled with ``value`` (default dtype and device unless given)."
full_like = functional(_full_like)
full_like.__name__ = full_like.__qualname__ = "full_like"
full_like.__doc__ = "``full`` with the shape, dtype and device of ``x`` (a tensor, value or TensorType)."


def zeros(shape: Any, *, dtype: DType | None = None, device: Any = None) -> Any:
    """A tensor of zeros."""
    return full(shape, 0, dtype=dtype, device=device)


def ones(shape: Any, *, dtype: DType | None = None, device: Any = None) -> Any:
    """A tensor of ones."""
    return full(shape, 1, dtype=dtype, device=device)


def zeros_like(x: Any, *, dtype: DType | None = None, device: Any = None) -> Any:
    """Zeros with the shape, dtype and device of ``x``."""
    return full_like(x, 0, dtype=dtype, device=device)


def ones_like(x: Any, *, dtype: DType | None = None, device: Any = None) -> Any:
    """Ones with the shape, dtype and device of ``x``."""
    return full_like(x, 1, dtype=dtype, device=device)


def arange(start: Any = 0, stop: Any = None, step: Any = 1, out_dim: Any = None, *, dtype: DType | None = None,
           device: Any = None) -> Any:
    """``start, start + step, ...`` below ``stop`` (``arange(n)`` counts from 0); ``ops.range``."""
    if stop is None:
        start, stop = 0, start
    dtype, dev = defaults(dtype, device.to_device() if isinstance(device, DeviceRef) else device)
    return range(start, stop, step, out_dim, dtype=dtype, device=_device_ref(dev))  # noqa: F821


def _from_dim(dim: Any, *, dtype: DType | None = None, device: Any = None) -> Any:
    from max.graph.dim import Dim, StaticDim
    from max.graph.ops._common import dim_to_tensor

    try:
        d = Dim(dim)
    except (TypeError, ValueError) as e:
        raise TypeError(f"from_dim: expected a Dim, an int or a dim name, got {dim!r} ({e})") from None
    if not isinstance(d, StaticDim) and not _in_graph():
        raise ValueError(f"Tensor.from_dim({d}): a symbolic dimension has no value in eager mode. Use a static "
                         "dimension, or call this while building a graph (e.g. inside Module.compile or "
                         "F.functional).")
    _, dev = defaults(None, device.to_device() if isinstance(device, DeviceRef) else device)
    ref = _device_ref(dev)
    v = _ops.cast(dim_to_tensor(d), dtype or DType.int64)
    return v if v.device == ref else _ops.transfer_to(v, ref)


from_dim = functional(_from_dim)
from_dim.__name__ = from_dim.__qualname__ = "from_dim"
from_dim.__doc__ = "A rank-0 tensor holding the size ``dim`` (int64 unless ``dtype``; symbolic dims inside a graph)."


# ----------------------------------------------------------------------------- clamp
def _clamp(x: Any, min: Any = None, max: Any = None) -> Any:  # noqa: A002
    if min is None and max is None:
        raise ValueError("clamp: give min, max or both")
    y = x
    if min is not None:
        y = _ops.max(y, min)
    if max is not None:
        y = _ops.min(y, max)
    return y


clamp = functional(_clamp)
clamp.__name__ = clamp.__qualname__ = "clamp"
clamp.__doc__ = "``x`` limited to ``[min, max]`` (either bound may be None; scalars are weak)."
clip = clamp


# ----------------------------------------------------------------------------- control flow
def cond(pred: Any, out_types: Iterable[Any] | None, then_fn: Callable[[], Any], else_fn: Callable[[], Any]) -> Any:
    """``then_fn()`` if ``pred`` else ``else_fn()``: the graph op inside a graph, Python control flow on
    eager tensors (``pred`` a bool or one-element bool tensor)."""
    if _in_graph():
        return _ops.cond(pred, out_types, then_fn, else_fn)
    if isinstance(pred, Tensor) and pred.dtype is not DType.bool:
        raise TypeError(f"cond: pred must be a bool tensor, got {pred.dtype}")
    return then_fn() if bool(pred) else else_fn()


def while_loop(initial_values: Any, predicate: Callable[..., Any], body: Callable[..., Any]) -> Any:
    """Run ``body`` while ``predicate`` holds: the graph op inside a graph, a Python loop on eager tensors.
    Returns the final values (a list, like ``ops.while_loop``)."""
    if _in_graph():
        return _ops.while_loop(initial_values, predicate, body)
    vals = list(initial_values) if isinstance(initial_values, (list, tuple)) else [initial_values]
    while bool(predicate(*vals)):
        out = body(*vals)
        out = list(out) if isinstance(out, (list, tuple)) else [out]
        if len(out) != len(vals):
            raise ValueError(f"while_loop: body returned {len(out)} values for {len(vals)} loop values")
        vals = out
    return vals


_COMPOSITES = ("arange", "clamp", "clip", "cond", "from_dim", "full", "full_like", "ones", "ones_like", "while_loop", "zeros",
               "zeros_like")
__all__ = ["functional", *_OPS, *_COMPOSITES]

from max.experimental import tensor as _tensor  # noqa: E402

_tensor._add, _tensor._sub, _tensor._mul, _tensor._div = add, sub, mul, div  # type: ignore[name-defined]  # noqa: F821
del _name
