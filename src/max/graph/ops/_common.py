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
    elif isinstance(x, (float, np.floating)):
        # rounded like a literal of the tensor's dtype: a value past its range is inf (MAX: x_f16 + 1e300)
        with np.errstate(over="ignore"):
            x = float(np.array([x], dtype=np.float64).astype(dt.to_numpy())[0])
    return constant(x, dt, like.device)


def _is_tensor_operand(x: Any) -> bool:
    return isinstance(x, Value) or hasattr(x, "_bound") or hasattr(x, "__tensorvalue__")


def binary_operands(lhs: Any, rhs: Any, op: str) -> tuple[TensorValue, TensorValue]:
    """Convert the operands of a binary op; weak scalars take the tensor side's dtype.

    Two Python/numpy scalars are a TypeError, as in MAX (neither side gives a dtype)."""
    lt, rt = _is_tensor_operand(lhs), _is_tensor_operand(rhs)
    if is_scalar_like(lhs) and is_scalar_like(rhs):
        raise TypeError(
            "Binary ops require at least one max object as input. "
            f"Got {type(lhs).__name__} and {type(rhs).__name__} ({op}); make one of them a tensor "
            "(ops.constant)"
        )
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


def broadcast_diagnostic(name_a: str, a: Shape, name_b: str, b: Shape) -> str | None:
    """MAX's verifier diagnostic when shapes ``a`` and ``b`` do not broadcast, else None::

        Input x (shape [2, 4]) dimension at axis 1 (value 4) and input y (shape [2, 6]) dimension
        at axis 1 (value 6) are neither equivalent nor broadcastable. Insert an explicit rebind if
        these dims will be equivalent at runtime.
    """
    ra, rb = len(a), len(b)
    for i in range(min(ra, rb)):
        da, db = a[ra - 1 - i], b[rb - 1 - i]
        if da == db or da == 1 or db == 1:
            continue
        return (f"Input {name_a} (shape {a._text()}) dimension at axis {ra - 1 - i} (value {da}) and input "
                f"{name_b} (shape {b._text()}) dimension at axis {rb - 1 - i} (value {db}) are neither "
                "equivalent nor broadcastable. Insert an explicit rebind if these dims will be equivalent at runtime.")
    return None


def op_names(op: str) -> tuple[str, str]:
    """MAX's op class and operation for the graph op ``op``: ``("SubOp", "rmo.sub")``."""
    special = {"where": ("SelectOp", "rmo.select"), "logical_and": ("AndOp", "rmo.and"),
               "logical_or": ("OrOp", "rmo.or"), "logical_xor": ("XorOp", "rmo.xor"),
               "logical_not": ("MoNotOp", "rmo.mo.not"), "slice_tensor": ("SliceOp", "rmo.slice")}
    if op in special:
        return special[op]
    return "".join(p.capitalize() for p in op.split("_")) + "Op", f"rmo.{op}"


# ----------------------------------------------------------------------------- MAX's error forms
def verifier_error(name: str, rmo: str, inputs: Sequence[tuple[str, Any]], *diagnostics: str) -> ValueError:
    """The ValueError MAX raises when an op's verifier rejects its inputs at build time::

        Failed to create op '<name>':
        Inputs:
            <param> = <repr of the input>
            ...

        Diagnostics:
            <diagnostic line>
        Failed to infer result type(s) for '<rmo>'

    ``name`` is MAX's op class (``"SubOp"``), ``rmo`` its operation (``"rmo.sub"``);
    the diagnostic lines are the key phrases."""
    lines = [f"Failed to create op '{name}':", "Inputs:"]
    lines += [f"    {param} = {value!r}" for param, value in inputs]
    lines += ["", "Diagnostics:"]
    lines += [f"    {d}" for d in diagnostics]
    lines.append(f"Failed to infer result type(s) for '{rmo}'")
    return ValueError("\n".join(lines))


def verifier_fail(name: str, rmo: str, inputs: Sequence[tuple[str, Any]], *diagnostics: str) -> None:
    raise verifier_error(name, rmo, inputs, *diagnostics)


def promote_operands(op: str, named: Sequence[tuple[str, Any]], shown: Sequence[tuple[str, Any]] | None = None) -> DType:
    """The common dtype of the named operands (MAX's promotion rules), or MAX's verifier error
    for ``op`` (``Failed to create op 'SubOp': ... Unsafe cast from ui16 to f16 ...``) listing
    ``shown`` (default: ``named``) as its inputs."""
    from max.graph.dtype_promotion import promote_dtypes, promotion_error

    dts = [v.dtype for _, v in named]
    diag = promotion_error(dts)
    if diag is not None:
        verifier_fail(*op_names(op), list(shown or named), diag)
    return promote_dtypes(*dts)


_AXIS_FORMS = ("index", "reduce", "split", "scatter", "value")


def normalize_axis(axis: Any, rank: int, op: str, arg: str = "axis", form: str = "index") -> int:
    """``axis`` in ``[-rank, rank)`` made non-negative; out of range raises what MAX raises:

    - ``"index"`` (the default: transpose, stack, concat, squeeze, gather, softmax, ...):
      IndexError ``Axis <arg> out of range (expected to be in range of [-r, r-1], but got a)``
      (``arg`` left out when it is the plain ``axis``);
    - ``"value"``: the same text as a ValueError (repeat_interleave, as its reference documents);
    - ``"reduce"`` (sum, mean, prod, max, min, argmax, argmin): ValueError
      ``Invalid axis=a for input x.rank=r``;
    - ``"split"``: IndexError ``Axis must be in range [-r, r), got a``;
    - ``"scatter"`` (the scatter family): ValueError ``Invalid axis value a. Axis must be in range [-r, r-1]``.

    A non-int ``axis`` is a TypeError naming ``op``."""
    if form not in _AXIS_FORMS:
        raise ValueError(f"normalize_axis: unknown form {form!r}; one of {_AXIS_FORMS}")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        fail(op, f"{arg} must be an int, got {type(axis).__name__} {axis!r}", TypeError)
    a = int(axis)
    if -rank <= a < rank:
        return a + rank if a < 0 else a
    if form == "reduce":
        raise ValueError(f"Invalid axis={a} for input x.rank={rank}")
    if form == "split":
        raise IndexError(f"Axis must be in range [{-rank}, {rank}), got {a}")
    if form == "scatter":
        raise ValueError(f"Invalid axis value {a}. Axis must be in range [{-rank}, {rank - 1}]")
    label = "" if arg == "axis" else f" {arg}"
    msg = f"Axis{label} out of range (expected to be in range of [{-rank}, {rank - 1}], but got {a})"
    raise (ValueError if form == "value" else IndexError)(msg)


def same_device(op: str, *vals: TensorValue, labels: Sequence[str] | None = None) -> DeviceRef:
    """The device every operand is on, or MAX's ValueError::

        Input values must be on the same device
            lhs: TensorType(dtype=float32, shape=[Dim(5), Dim(3)], device=cpu:0)
            rhs: TensorType(dtype=float32, shape=[Dim(5), Dim(3)], device=gpu:0)

    ``labels`` name the operands (MAX's: ``lhs``/``rhs``, ``input``/``indices``,
    ``condition``/``x``/``y``, ...); by default their positions ``0``, ``1``, ..."""
    dev = vals[0].device
    if all(v.device == dev for v in vals[1:]):
        return dev
    names = list(labels) if labels is not None else [str(i) for i in range(len(vals))]
    msg = "Input values must be on the same device"
    msg += "".join(f"\n    {n}: {v.type!r}" for n, v in zip(names, vals))
    raise ValueError(msg)


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
