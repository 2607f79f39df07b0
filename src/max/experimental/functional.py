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

import builtins
from typing import Any, Callable, Iterable

import numpy as np

from max.dtype import DType
from max.experimental._context import _resolve
from max.experimental.tensor import Tensor, functional
from max.graph import ops as _ops
from max.graph.graph import _ACTIVE
from max.graph.type import DeviceRef, TensorType

_OPS = (
    "abs", "acos", "add", "argmax", "argmin", "argsort", "as_interleaved_complex",
    "atanh", "avg_pool2d", "band_part", "bottom_k", "broadcast_to", "buffer_store", "buffer_store_slice", "cast",
    "ceil", "chunk", "concat", "constant", "constant_external", "conv2d", "conv2d_transpose", "conv3d", "cos",
    "cumsum", "custom", "div", "equal", "erf", "exp", "flatten", "floor", "floor_div", "fold", "gather",
    "gather_nd", "gelu", "greater", "greater_equal", "group_norm", "hann_window", "inplace_custom", "irfft",
    "is_inf", "is_nan", "layer_norm", "log", "log1p", "logical_and", "logical_not", "logical_or", "logical_xor",
    "logsoftmax", "masked_scatter", "matmul", "max", "max_pool2d", "mean", "min", "mod", "mul", "negate",
    "non_maximum_suppression", "nonzero", "not_equal", "outer", "pad", "permute", "pow", "prod",
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


# ----------------------------------------------------------------------------- print
_print_op = functional(_ops.print)


def print(value: Any, label: str = "debug_tensor") -> None:  # noqa: A001 - reference name
    """Print ``value``: inside a graph the ``ops.print`` node (it prints when the model runs); on an
    eager tensor at once, as ``Tensor <label>= <repr(value)>`` (a str is printed as it is)."""
    if _in_graph() or not isinstance(value, (Tensor, str)) or not isinstance(label, str):
        return _print_op(value, label)
    import builtins

    builtins.print(value if isinstance(value, str) else f"Tensor {label}= {value!r}", flush=True)
    return None


print.__wrapped_op__ = _ops.print  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- collectives on distributed tensors
# (the graph collectives over per-device lists are ``functional(ops.allgather)`` / ``ops.allreduce.sum``)
def _mesh_group(x: Any, mesh_axis: int | str, who: str) -> tuple[Any, int]:
    from max.experimental import sharding as S

    if not isinstance(x, Tensor):
        raise TypeError(f"{who}: expected a Tensor, got {type(x).__name__}")
    if not isinstance(x, S.DistributedTensor):
        if mesh_axis not in (0, "_"):
            raise ValueError(f"{who}: mesh_axis {mesh_axis!r} out of range for a one-device tensor (mesh {x.mesh})")
        return None, 0
    return x, x.mesh.axis_index(mesh_axis)


def _along(x: Any, ax: int, combine: Callable[[list], Any], placement: Any) -> Any:
    """Every device's local replaced by ``combine`` of the locals of its group on mesh axis ``ax``."""
    import builtins

    import numpy as np

    from max.experimental import sharding as S

    cells = np.empty(x.mesh.mesh_shape, dtype=object)
    n = x.mesh.mesh_shape[ax]
    for c in x.mesh.coords():
        group = [x._cells[tuple(c[:ax]) + (k,) + tuple(c[ax + 1:])] for k in builtins.range(n)]  # F.range shadows
        cells[c] = combine([g.to(x._cells[c].device) for g in group])
    placements = list(x.placements)
    placements[ax] = placement
    return S.DistributedTensor(cells, S.PlacementMapping(x.mesh, tuple(placements)))


def allgather(t: Any, tensor_axis: int = 0, mesh_axis: int | str = 0) -> Any:
    """Concatenate the local tensors of ``t`` along ``tensor_axis`` over mesh axis ``mesh_axis``: every
    device of that axis gets the whole (``Sharded(tensor_axis)`` becomes ``Replicated``).  An ordinary
    tensor lives on a one-device mesh, where gathering one piece gives it back."""
    import torch

    from max.experimental import sharding as S

    x, ax = _mesh_group(t, mesh_axis, "allgather")
    rank = t.rank
    if not -builtins.max(rank, 1) <= tensor_axis < builtins.max(rank, 1):
        raise ValueError(f"allgather: tensor_axis {tensor_axis} out of range for a rank-{rank} tensor")
    if x is None:
        return t
    if isinstance(x.placements[ax], S.Partial):
        raise ValueError(f"allgather: mesh axis {mesh_axis!r} holds partial values ({x.placements[ax]}); "
                         "reduce them first (allreduce_sum / reduce_scatter)")
    return _along(x, ax, lambda parts: torch.cat(parts, dim=tensor_axis), S.Replicated())


def allreduce_sum(t: Any, mesh_axis: int | str = 0) -> Any:
    """Sum the local tensors of ``t`` over mesh axis ``mesh_axis``; every device of that axis gets the sum
    (``Partial(SUM)`` becomes ``Replicated``).  An ordinary tensor (one device) is its own sum."""
    from max.experimental import sharding as S

    x, ax = _mesh_group(t, mesh_axis, "allreduce_sum")
    if x is None:
        return t
    shapes = {tuple(c.shape) for c in x._cells.flat}
    if len(shapes) != 1:
        raise ValueError(f"allreduce_sum: the local tensors have different shapes {sorted(shapes)}")

    def total(parts: list) -> Any:
        out = parts[0].clone()
        for p in parts[1:]:
            out += p
        return out

    return _along(x, ax, total, S.Replicated())


_EAGER_COMPOSITES = ("allgather", "allreduce_sum", "print")


# ----------------------------------------------------------------------------- creation
def _device_ref(device: Any) -> DeviceRef:
    return device if isinstance(device, DeviceRef) else DeviceRef.from_device(device)


def _in_graph() -> bool:
    from max.experimental._compute import _ComputeIR

    active = _ACTIVE.get()
    return bool(active) and not isinstance(active[-1], _ComputeIR)


def _full(shape: Any, value: Any, *, dtype: DType | None = None, device: Any = None) -> Any:
    dtype, dev = _resolve(dtype, device.to_device() if isinstance(device, DeviceRef) else device)
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
    dtype, dev = _resolve(dtype, device.to_device() if isinstance(device, DeviceRef) else device)
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
    _, dev = _resolve(None, device.to_device() if isinstance(device, DeviceRef) else device)
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


# ----------------------------------------------------------------------------- MAX 26.7 names
# Random draws (max.experimental.random, which defines them once).
from max.experimental.random import (  # noqa: E402
    gaussian,
    gaussian_like,
    normal,
    normal_like,
    uniform,
    uniform_like,
)


def _elementwise_max(lhs: Any, rhs: Any) -> Any:
    return _ops.max(lhs, rhs)


def _elementwise_min(lhs: Any, rhs: Any) -> Any:
    return _ops.min(lhs, rhs)


elementwise_max = functional(_elementwise_max)
elementwise_max.__doc__ = "The elementwise maximum of ``lhs`` and ``rhs`` (broadcast; ``ops.max(lhs, rhs)``)."
elementwise_min = functional(_elementwise_min)
elementwise_min.__doc__ = "The elementwise minimum of ``lhs`` and ``rhs`` (broadcast; ``ops.min(lhs, rhs)``)."
rebind = functional(_ops.rebind)
shape_to_tensor = functional(_ops.shape_to_tensor)
dequantize = functional(_ops.dequantize)


def _complex_mul(lhs: Any, rhs: Any) -> Any:
    """Complex product of two tensors whose last dim holds (real, imag); the other dims broadcast."""
    from max.graph.ops._common import as_tensor

    lhs, rhs = as_tensor(lhs, op="complex_mul"), as_tensor(rhs, op="complex_mul")
    for name, v in (("lhs", lhs), ("rhs", rhs)):
        if v.rank == 0 or not v.shape[-1] == 2:
            raise ValueError(f"complex_mul: {name} must have a last dimension of size 2 (real, imag), "
                             f"got {v.type}")
    ar, ai = _ops.split(lhs, [1, 1], axis=-1)
    br, bi = _ops.split(rhs, [1, 1], axis=-1)
    real = _ops.sub(_ops.mul(ar, br), _ops.mul(ai, bi))
    imag = _ops.add(_ops.mul(ar, bi), _ops.mul(ai, br))
    return _ops.concat([real, imag], axis=-1)


complex_mul = functional(_complex_mul)
complex_mul.__doc__ = _complex_mul.__doc__


def _mesh_axis_of(x: Any, mesh_axis: int | str, who: str) -> int:
    return x.mesh.axis_index(mesh_axis)


def reduce_scatter(x: Any, scatter_axis: int = 0, mesh_axis: int | str = 0) -> Any:
    """Reduce the partial values of ``x`` along mesh axis ``mesh_axis`` and scatter the result along tensor
    axis ``scatter_axis``: that mesh axis's placement becomes ``Sharded(scatter_axis)`` (the others stay).

    ``x`` is a distributed tensor whose placement on ``mesh_axis`` is ``Partial`` (reduced with its
    ``reduce_op``) or ``Replicated`` (already reduced: only the scatter happens).  An ordinary tensor lives
    on a one-device mesh, where reducing over one device and scattering into one piece leave it as it is.
    """
    from max.experimental import sharding as S

    if not isinstance(x, S.DistributedTensor):
        if not isinstance(x, Tensor):
            raise TypeError(f"reduce_scatter: expected a Tensor, got {type(x).__name__}")
        if not -builtins.max(x.rank, 1) <= scatter_axis < builtins.max(x.rank, 1):
            raise ValueError(f"reduce_scatter: scatter_axis {scatter_axis} out of range for rank {x.rank}")
        return x
    ax = _mesh_axis_of(x, mesh_axis, "reduce_scatter")
    if not -x.rank <= scatter_axis < x.rank:
        raise ValueError(f"reduce_scatter: scatter_axis {scatter_axis} out of range for rank {x.rank}")
    p = x.placements[ax]
    if isinstance(p, S.Sharded):
        raise ValueError(f"reduce_scatter: mesh axis {mesh_axis} is {p}; expected Partial or Replicated")
    placements = list(x.placements)
    placements[ax] = S.Sharded(scatter_axis)
    # The global value reduces every Partial axis; the other Partial axes are laid out again as partials.
    return S.distribute(x.full_tensor(), S.PlacementMapping(x.mesh, tuple(placements)))


def distributed_broadcast(x: Any, mesh_axis: int | str = 0, root: int = 0, *, mesh: Any = None) -> Any:
    """Copy the local tensor of device ``root`` along mesh axis ``mesh_axis`` to every device on that axis
    (its placement becomes ``Replicated``).  An ordinary tensor is one device's value: with ``mesh`` it is
    copied to every device of that mesh (a fully replicated distributed tensor), without it returned as
    it is."""
    from max.experimental import sharding as S

    if not isinstance(x, S.DistributedTensor):
        if not isinstance(x, Tensor):
            raise TypeError(f"distributed_broadcast: expected a Tensor, got {type(x).__name__}")
        if root != 0:
            raise ValueError(f"distributed_broadcast: root {root} out of range for a one-device tensor")
        if mesh is None:
            return x
        if not isinstance(mesh, S.DeviceMesh):
            raise TypeError(f"distributed_broadcast: mesh must be a DeviceMesh, got {type(mesh).__name__}")
        return S.distribute(x, S.PlacementMapping(mesh, (S.Replicated(),) * mesh.ndim))
    if mesh is not None and mesh != x.mesh:
        raise ValueError(f"distributed_broadcast: x lives on {x.mesh}, not on {mesh}")
    ax = _mesh_axis_of(x, mesh_axis, "distributed_broadcast")
    n = x.mesh.mesh_shape[ax]
    if not 0 <= root < n:
        raise ValueError(f"distributed_broadcast: root {root} out of range for mesh axis of size {n}")
    cells = np.empty(x.mesh.mesh_shape, dtype=object)
    for c in x.mesh.coords():
        src = list(c)
        src[ax] = root
        cells[c] = x._cells[tuple(src)].clone().to(x._cells[c].device)
    placements = list(x.placements)
    placements[ax] = S.Replicated()
    return S.DistributedTensor(cells, S.PlacementMapping(x.mesh, tuple(placements)))


# ----------------------------------------------------------------------------- control flow
def cond(pred: Any, out_types: Iterable[Any] | None, then_fn: Callable[[], Any], else_fn: Callable[[], Any]) -> Any:
    """``then_fn()`` if ``pred`` else ``else_fn()``: the graph op inside a graph, Python control flow on
    eager tensors (``pred`` a bool or one-element bool tensor).  Either way the results come back as a
    list, one per ``out_types`` entry (``[]`` when ``out_types`` is None), as ``ops.cond`` returns them."""
    if _in_graph():
        return _ops.cond(pred, out_types, then_fn, else_fn)
    if isinstance(pred, Tensor) and pred.dtype is not DType.bool:
        raise TypeError(f"cond: pred must be a bool tensor, got {pred.dtype}")
    name = "then" if bool(pred) else "else"
    out = then_fn() if name == "then" else else_fn()
    results = [] if out is None else list(out) if isinstance(out, (list, tuple)) else [out]
    n = 0 if out_types is None else len(list(out_types))
    if len(results) != n:
        raise ValueError(f"cond: {name}_fn returned {len(results)} value(s), out_types has {n}")
    return results


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
               "zeros_like",
               # MAX 26.7 names
               "complex_mul", "dequantize", "distributed_broadcast", "elementwise_max", "elementwise_min",
               "gaussian", "gaussian_like", "normal", "normal_like", "rebind", "reduce_scatter", "shape_to_tensor",
               "uniform", "uniform_like")
__all__ = ["functional", *_OPS, *_COMPOSITES]

from max.experimental import tensor as _tensor  # noqa: E402

_tensor._add, _tensor._sub, _tensor._mul, _tensor._div = add, sub, mul, div  # type: ignore[name-defined]  # noqa: F821
del _name
__all__ += list(_EAGER_COMPOSITES)
