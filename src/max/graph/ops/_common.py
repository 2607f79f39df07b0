"""What every op's type rule shares: operand conversion, staging, broadcasting
and axis normalisation.  Errors raised here name the op.  Dtype promotion lives
in :mod:`max.graph.dtype_promotion` (``promote`` is re-exported here)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from max.dtype import DType
from max.graph.dim import Dim, StaticDim
from max.graph.dtype_promotion import check_weak_scalar, promote
from max.graph.shape import Shape
from max.graph.type import DeviceRef, TensorType, Type, _as_device_ref
from max.graph.value import BufferValue, TensorValue, Value

_PY_SCALARS = (bool, int, float, np.bool_, np.integer, np.floating)


class OpError(ValueError):
    """A ValueError raised while building a graph (its message starts with the op's name)."""


def fail(op: str, msg: str, exc: type = ValueError) -> None:
    raise exc(f"{op}: {msg}")


def current_graph(op: str):
    from max.graph.graph import Graph, NoGraphError

    try:
        return Graph.current
    except NoGraphError:
        raise NoGraphError(
            f"{op}: no graph is being built; call ops inside `with Graph(name, input_types=...)`"
        ) from None


def stage(
    op: str,
    operands: Sequence[Value],
    result_types: Sequence[Type],
    attrs: dict | None = None,
    *,
    side_effects: bool = False,
    regions: tuple = (),
) -> list:
    """Append a node for ``op`` to the graph of its operands (or the current graph)."""
    graph = current_graph(op)
    return graph._add_node(op, operands, result_types, attrs, side_effects=side_effects, regions=regions)


def stage1(op: str, operands: Sequence[Value], result_type: Type, attrs: dict | None = None, **kw: Any) -> Any:
    return stage(op, operands, [result_type], attrs, **kw)[0]


def is_scalar_like(x: Any) -> bool:
    return isinstance(x, _PY_SCALARS)


def as_tensor(
    x: Any,
    *,
    op: str,
    arg: str = "x",
    dtype: DType | None = None,
    device: DeviceRef | None = None,
) -> TensorValue:
    """Convert a TensorValueLike to a TensorValue of the current graph.

    Python/numpy scalars and arrays become constants (``dtype`` when given,
    else float32 for floats, int64 for ints, bool for bools).  A ``Dim``
    becomes an int64 scalar, a ``Shape`` (or list of Dims) a 1-D int64 tensor.
    """
    from max.graph.weight import Weight

    if isinstance(x, Weight):
        return x._bound()
    if isinstance(x, TensorValue):
        return x
    if isinstance(x, Value):
        if isinstance(x, BufferValue):
            fail(op, f"{arg} is a buffer ({x.type}); load it with ops.buffer_load first", TypeError)
        fail(op, f"{arg} must be a tensor, got a value of type {x.type}", TypeError)
    if hasattr(x, "__tensorvalue__"):
        return as_tensor(x.__tensorvalue__(), op=op, arg=arg)
    if hasattr(x, "_as_tensor_value"):
        return as_tensor(x._as_tensor_value(), op=op, arg=arg)
    if isinstance(x, Dim):
        return dim_to_tensor(x, device=device)
    if isinstance(x, Shape):
        from max.graph.ops.shape import shape_to_tensor

        return shape_to_tensor(x)
    dev = device or DeviceRef.CPU()
    if is_scalar_like(x) or isinstance(x, np.ndarray):
        from max.graph.ops.constant import constant

        if dtype is None:
            dtype = _infer_dtype(x, op, arg)
        return constant(x, dtype, dev)
    if isinstance(x, (list, tuple)) and x and all(isinstance(e, (int, np.integer, Dim)) for e in x) and any(
        isinstance(e, Dim) for e in x
    ):
        from max.graph.ops.shape import shape_to_tensor

        return shape_to_tensor(Shape(x))
    if isinstance(x, (list, tuple)):
        arr = np.asarray(x)
        if arr.dtype == object:
            fail(op, f"{arg}: cannot make a tensor from {x!r}", TypeError)
        return as_tensor(arr, op=op, arg=arg, dtype=dtype, device=dev)
    fail(
        op,
        f"{arg} must be a TensorValue or tensor-like value (scalar, numpy array, Dim, Shape), "
        f"got {type(x).__name__}",
        TypeError,
    )
    raise AssertionError  # unreachable


def _infer_dtype(x: Any, op: str, arg: str) -> DType:
    if isinstance(x, np.ndarray):
        try:
            return DType.from_numpy(x.dtype)
        except ValueError:
            fail(op, f"{arg}: numpy dtype {x.dtype} is not supported", TypeError)
    if isinstance(x, (bool, np.bool_)):
        return DType.bool
    if isinstance(x, (int, np.integer)):
        return DType.int64
    return DType.float32


def dim_to_tensor(d: Dim, device: DeviceRef | None = None) -> TensorValue:
    """A rank-0 int64 tensor holding the (possibly symbolic) size ``d``."""
    from max.graph.ops.shape import shape_to_tensor
    from max.graph.ops.shape import reshape

    t = shape_to_tensor(Shape([d]))
    return reshape(t, [])


def scalar_operand(x: Any, like: TensorValue, op: str, arg: str) -> TensorValue:
    """A weak Python/numpy scalar operand takes the other operand's dtype and device.

    ValueError (naming ``op`` and ``arg``) when the value does not fit that
    dtype (``int_tensor + 1.5``, ``uint8_tensor + 300``); see
    :mod:`max.graph.dtype_promotion`.
    """
    from max.graph.ops.constant import constant

    dt = like.dtype
    check_weak_scalar(x, dt, op, arg)
    if isinstance(x, (bool, np.bool_)) and dt is not DType.bool:
        x = int(x)
    elif isinstance(x, (float, np.floating)) and not dt.is_float():
        x = int(x)
    return constant(x, dt, like.device)


def _is_tensor_operand(x: Any) -> bool:
    return isinstance(x, Value) or hasattr(x, "_bound") or hasattr(x, "__tensorvalue__")


def binary_operands(lhs: Any, rhs: Any, op: str) -> tuple[TensorValue, TensorValue]:
    """Convert the operands of a binary op; weak scalars take the tensor side's dtype."""
    lt, rt = _is_tensor_operand(lhs), _is_tensor_operand(rhs)
    if lt and not rt and is_scalar_like(rhs):
        a = as_tensor(lhs, op=op, arg="lhs")
        return a, scalar_operand(rhs, a, op, "rhs")
    if rt and not lt and is_scalar_like(lhs):
        b = as_tensor(rhs, op=op, arg="rhs")
        return scalar_operand(lhs, b, op, "lhs"), b
    a = as_tensor(lhs, op=op, arg="lhs")
    b = as_tensor(rhs, op=op, arg="rhs", device=a.device)
    return a, b


def broadcast_shapes(a: Shape, b: Shape, op: str, what: str = "operands") -> Shape:
    """NumPy broadcasting of two shapes; symbolic dims must match by name (or be 1)."""
    ra, rb = len(a), len(b)
    out = []
    for i in range(max(ra, rb)):
        da = a[ra - 1 - i] if i < ra else StaticDim(1)
        db = b[rb - 1 - i] if i < rb else StaticDim(1)
        if da == db:
            out.append(da)
        elif da == 1:
            out.append(db)
        elif db == 1:
            out.append(da)
        else:
            fail(op, f"{what} shapes {a} and {b} cannot be broadcast: dims {da} and {db} differ "
                     f"(axis {-1 - i})")
    return Shape(reversed(out))


def normalize_axis(axis: Any, rank: int, op: str, arg: str = "axis") -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        fail(op, f"{arg} must be an int, got {type(axis).__name__} {axis!r}", TypeError)
    axis = int(axis)
    if not -rank <= axis < rank:
        fail(op, f"{arg}={axis} is out of range for a rank-{rank} tensor (valid: {-rank}..{rank - 1})", IndexError)
    return axis + rank if axis < 0 else axis


def same_device(op: str, *vals: TensorValue) -> DeviceRef:
    dev = vals[0].device
    for v in vals[1:]:
        if v.device != dev:
            fail(op, f"operands are on different devices ({dev} and {v.device}); move one with ops.transfer_to")
    return dev


def tensor_type(dtype: DType, shape: Any, device: DeviceRef) -> TensorType:
    return TensorType(dtype, shape, device)


def as_shape(shape: Any, op: str, arg: str = "shape") -> Shape:
    if isinstance(shape, TensorValue):
        fail(op, f"{arg} must be static or symbolic dims, not a tensor value", TypeError)
    try:
        return shape if isinstance(shape, Shape) else Shape(shape)
    except TypeError as e:
        fail(op, f"{arg}: {e}", TypeError)
    raise AssertionError


def static_int(d: Dim, op: str, what: str) -> int:
    if not isinstance(d, StaticDim):
        fail(op, f"{what} must be static, got symbolic dim {d}")
    return d.dim  # type: ignore[union-attr]


def host_only(op: str, *vals: TensorValue) -> None:
    """Apply the graph's DevicePlacementPolicy to an op whose kernel runs on the host when an
    operand lives on an accelerator (warn by default, raise under ``Error``)."""
    gpu = [v for v in vals if v.device.is_gpu()]
    if not gpu:
        return
    from max.graph.graph import DevicePlacementPolicy

    policy = current_graph(op)._root().strict_device_placement
    msg = (f"{op}: runs on the host; its operand on {gpu[0].device} is transferred to the CPU and back "
           "(strict_device_placement)")
    if policy is DevicePlacementPolicy.Error:
        fail(op, msg.split(": ", 1)[1])
    if policy is DevicePlacementPolicy.Warn:
        import warnings

        warnings.warn(msg, UserWarning, stacklevel=4)


def as_device_ref(device: Any, op: str) -> DeviceRef:
    return _as_device_ref(device, op)
