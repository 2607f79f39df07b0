"""Elementwise ops: unary math, binary arithmetic, comparisons, logic, ``where`` and ``cast``.

Type rules: binary ops broadcast their operands (NumPy rules; symbolic dims
must match by name or be 1) and promote them to a common dtype under MAX's
rules (:mod:`max.graph.dtype_promotion`: the result is always one of the
input dtypes; float32 with int32 or uint8 with int8 is a ValueError), inserting
``cast`` nodes so kernels always see equal dtypes.  A Python/numpy scalar is
weak: it takes the other operand's dtype when its value fits (``int_tensor +
1.5`` is a ValueError).  ``div`` is true division: integer operands give float32.
Arithmetic on bool tensors (``b + b``, ``b - b``, ``b * b``, ``b / b``, ``-b``) gives
bool, as in MAX.  Errors follow MAX's texts: dtype and shape mismatches are its
verifier messages (``Failed to create op 'SubOp': ...``), operands on different
devices ``Input values must be on the same device``.
"""

from __future__ import annotations

from typing import Any

from max.dtype import DType
from max.dtype.dtype import BIT_STORED
from max.graph.dtype_promotion import mlir_name
from max.graph.ops._common import (
    as_tensor,
    binary_operands,
    broadcast_diagnostic,
    fail,
    host_only,
    op_names,
    promote_operands,
    same_device,
    stage1,
    verifier_fail,
)
from max.graph.shape import Shape
from max.graph.type import TensorType
from max.graph.value import TensorValue

_FLOAT_ONLY = {
    "exp", "log", "log1p", "sqrt", "rsqrt", "sin", "cos", "tanh", "atanh", "acos", "erf",
    "sigmoid", "silu", "gelu",
}
_NUMERIC = {"abs", "negate", "relu", "floor", "ceil", "round", "trunc"}
_WIDE_UNSIGNED = {DType.uint16, DType.uint32, DType.uint64}


def cast(x: Any, dtype: DType) -> TensorValue:
    """``x`` converted to ``dtype`` (same shape)."""
    x = as_tensor(x, op="cast")
    if not isinstance(dtype, DType):
        fail("cast", f"dtype must be a DType, got {type(dtype).__name__} {dtype!r}", TypeError)
    if x.dtype is dtype:
        return x
    if x.dtype in BIT_STORED or dtype in BIT_STORED:
        # float4/float6 have no torch dtype: converted through ml_dtypes (bit patterns in uint8)
        host_only("cast", x)
        return stage1("cast_bits", [x], TensorType(dtype, x.shape, x.device), {"src": x.dtype.name, "dst": dtype.name})
    return stage1("cast", [x], TensorType(dtype, x.shape, x.device), {"dtype": dtype})


def _unary(op: str, x: Any, attrs: dict | None = None, *, result_dtype: DType | None = None) -> TensorValue:
    if not isinstance(x, TensorValue) and op in ("gelu", "silu"):
        # the reference documents these as taking a TensorValue only
        if not hasattr(x, "_bound"):
            fail(op, f"x must be a TensorValue, got {type(x).__name__}", TypeError)
    x = as_tensor(x, op=op)
    dt = x.dtype
    if op in _FLOAT_ONLY and not dt.is_float():
        fail(op, f"x must be a floating-point tensor, got {dt}; cast it first (e.g. x.cast(DType.float32))",
             TypeError)
    if op == "negate" and dt is DType.bool:
        return _bool_arith(op, [x], DType.int32)  # MAX: -b is bool
    if op in _NUMERIC and dt is DType.bool:
        fail(op, f"x must be numeric, got {dt}", TypeError)
    return stage1(op, [x], TensorType(result_dtype or dt, x.shape, x.device), attrs)


def _bool_arith(op: str, operands: list[TensorValue], via: DType) -> TensorValue:
    """Arithmetic on bool tensors gives bool, as in MAX: computed in ``via`` and converted back
    (non-zero is True: ``b + b`` is or, ``b - b`` xor, ``b * b`` and, ``-b`` is ``b``)."""
    wide = [cast(v, via) for v in operands]
    shape = _broadcast(op, list(zip(("lhs", "rhs"), wide)))
    r = stage1(op, wide, TensorType(via, shape, wide[0].device))
    return cast(r, DType.bool)


def _broadcast(op: str, named: list[tuple[str, TensorValue]]) -> Shape:
    """The broadcast shape of the operands, or MAX's verifier error naming them."""
    shape, cur = named[0][1].shape, named[0][0]
    for name, v in named[1:]:
        diag = broadcast_diagnostic(cur, shape, name, v.shape)
        if diag is not None:
            verifier_fail(*op_names(op), named, diag)
        ra, rb = len(shape), len(v.shape)
        out = []
        for i in range(max(ra, rb)):
            da = shape[ra - 1 - i] if i < ra else None
            db = v.shape[rb - 1 - i] if i < rb else None
            out.append(db if da is None or (da == 1 and db is not None) else da)
        shape = Shape(reversed(out))
    return shape


def _binary(op: str, lhs: Any, rhs: Any, *, kind: str = "arith") -> TensorValue:
    """kind: 'arith' (numeric result), 'div' (true division), 'compare' (bool), 'logical' (bool in/out).

    Bool operands of arithmetic give bool (MAX's rule; see :func:`_bool_arith`)."""
    a, b = binary_operands(lhs, rhs, op)
    named = [("lhs", a), ("rhs", b)]
    dev = same_device(op, a, b, labels=("lhs", "rhs"))
    if kind == "logical":
        if a.dtype is not DType.bool or b.dtype is not DType.bool:
            verifier_fail(*op_names(op), named,
                          f"{op_names(op)[1]}: Inputs must be bools, got {mlir_name(a.dtype)}, {mlir_name(b.dtype)}")
        shape = _broadcast(op, named)
        return stage1(op, [a, b], TensorType(DType.bool, shape, dev))
    dt = promote_operands(op, named)
    shape = _broadcast(op, named)
    if kind in ("arith", "div") and dt is DType.bool and op not in ("max", "min"):
        return _bool_arith(op, [a, b], DType.float32 if kind == "div" else DType.int32)
    if kind == "div" and not dt.is_float():
        dt = DType.float32
    a = cast(a, dt)
    b = cast(b, dt)
    if dt in _WIDE_UNSIGNED:
        # torch has no CPU arithmetic kernels for uint16/32/64: compute in
        # int64 and wrap back (uint64 values >= 2**63 are not supported).
        a, b = cast(a, DType.int64), cast(b, DType.int64)
        r = stage1(op, [a, b], TensorType(DType.int64 if kind != "compare" else DType.bool, shape, dev))
        return r if kind == "compare" else cast(r, dt)
    out_dt = DType.bool if kind == "compare" else dt
    return stage1(op, [a, b], TensorType(out_dt, shape, dev))


# ---------------------------------------------------------------- binary
def add(lhs: Any, rhs: Any) -> TensorValue:
    """Elementwise ``lhs + rhs`` with broadcasting."""
    return _binary("add", lhs, rhs)


def sub(lhs: Any, rhs: Any) -> TensorValue:
    """Elementwise ``lhs - rhs`` with broadcasting."""
    return _binary("sub", lhs, rhs)


def mul(lhs: Any, rhs: Any) -> TensorValue:
    """Elementwise ``lhs * rhs`` with broadcasting."""
    return _binary("mul", lhs, rhs)


def div(lhs: Any, rhs: Any) -> TensorValue:
    """True division; integer operands give a float32 result."""
    return _binary("div", lhs, rhs, kind="div")


def floor_div(lhs: Any, rhs: Any) -> TensorValue:
    """Elementwise ``lhs // rhs`` rounded toward negative infinity (Python/NumPy ``//``);
    the operands' common dtype (integer division by zero fails at execution)."""
    return _binary("floor_div", lhs, rhs)


def mod(lhs: Any, rhs: Any) -> TensorValue:
    """Elementwise modulo with the sign of the divisor (Python/NumPy ``%``)."""
    return _binary("mod", lhs, rhs)


def pow(lhs: Any, rhs: Any) -> TensorValue:  # noqa: A001 - reference name
    """Elementwise ``lhs ** rhs``."""
    return _binary("pow", lhs, rhs)


def _elementwise_max(lhs: Any, rhs: Any) -> TensorValue:
    return _binary("max", lhs, rhs)


def _elementwise_min(lhs: Any, rhs: Any) -> TensorValue:
    return _binary("min", lhs, rhs)


def equal(lhs: Any, rhs: Any) -> TensorValue:
    return _binary("equal", lhs, rhs, kind="compare")


def not_equal(lhs: Any, rhs: Any) -> TensorValue:
    return _binary("not_equal", lhs, rhs, kind="compare")


def greater(lhs: Any, rhs: Any) -> TensorValue:
    return _binary("greater", lhs, rhs, kind="compare")


def greater_equal(lhs: Any, rhs: Any) -> TensorValue:
    return _binary("greater_equal", lhs, rhs, kind="compare")


def logical_and(lhs: Any, rhs: Any) -> TensorValue:
    return _binary("logical_and", lhs, rhs, kind="logical")


def logical_or(lhs: Any, rhs: Any) -> TensorValue:
    return _binary("logical_or", lhs, rhs, kind="logical")


def logical_xor(lhs: Any, rhs: Any) -> TensorValue:
    return _binary("logical_xor", lhs, rhs, kind="logical")


def logical_not(x: Any) -> TensorValue:
    x = as_tensor(x, op="logical_not")
    if x.dtype is not DType.bool:
        verifier_fail(*op_names("logical_not"), [("x", x)],
                      "'rmo.mo.not' op operand #0 must be boolean element type")
    return stage1("logical_not", [x], x.type)


# ---------------------------------------------------------------- unary
def abs(x: Any) -> TensorValue:  # noqa: A001
    return _unary("abs", x)


def negate(x: Any) -> TensorValue:
    return _unary("negate", x)


def exp(x: Any) -> TensorValue:
    return _unary("exp", x)


def log(x: Any) -> TensorValue:
    return _unary("log", x)


def log1p(x: Any) -> TensorValue:
    return _unary("log1p", x)


def sqrt(x: Any) -> TensorValue:
    return _unary("sqrt", x)


def rsqrt(x: Any) -> TensorValue:
    return _unary("rsqrt", x)


def sin(x: Any) -> TensorValue:
    return _unary("sin", x)


def cos(x: Any) -> TensorValue:
    return _unary("cos", x)


def tanh(x: Any) -> TensorValue:
    return _unary("tanh", x)


def atanh(x: Any) -> TensorValue:
    return _unary("atanh", x)


def acos(x: Any) -> TensorValue:
    """Arccosine in ``[0, pi]`` (NaN outside ``[-1, 1]``); float input."""
    return _unary("acos", x)


def erf(x: Any) -> TensorValue:
    return _unary("erf", x)


def sigmoid(x: Any) -> TensorValue:
    return _unary("sigmoid", x)


def silu(x: Any) -> TensorValue:
    """``x * sigmoid(x)``."""
    return _unary("silu", x)


def relu(x: Any) -> TensorValue:
    return _unary("relu", x)


def floor(x: Any) -> TensorValue:
    return _unary("floor", x)


def ceil(x: Any) -> TensorValue:
    """Smallest integer value >= x (integer inputs are returned unchanged)."""
    return _unary("ceil", x)


def round(x: Any) -> TensorValue:  # noqa: A001
    """Round half to even (NumPy/torch semantics)."""
    return _unary("round", x)


def trunc(x: Any) -> TensorValue:
    return _unary("trunc", x)


def is_nan(x: Any) -> TensorValue:
    return _unary("is_nan", x, result_dtype=DType.bool)


def is_inf(x: Any) -> TensorValue:
    return _unary("is_inf", x, result_dtype=DType.bool)


def gelu(x: Any, approximate: str = "none") -> TensorValue:
    """GELU: ``'none'`` (exact, erf), ``'tanh'`` or ``'quick'`` (``sigmoid(1.702 x) * x``)."""
    if approximate not in ("none", "tanh", "quick"):
        fail("gelu", f"approximate must be 'none', 'tanh' or 'quick', got {approximate!r}")
    return _unary("gelu", x, {"approximate": approximate})


# ---------------------------------------------------------------- select
def where(condition: Any, x: Any, y: Any) -> TensorValue:
    """Elementwise ``x if condition else y`` (condition must be bool; all three broadcast).

    As in MAX: a non-bool condition is a ValueError (``Expected condition to be a boolean
    tensor, ...``); ``x`` and ``y`` promote like a binary op's operands (at least one must be
    a tensor: two Python scalars are a TypeError); shapes that do not broadcast and dtypes
    without a common type get MAX's verifier message (``SelectOp``)."""
    op = "where"
    c = as_tensor(condition, op=op, arg="condition")
    if c.dtype is not DType.bool:
        raise ValueError(f"Expected condition to be a boolean tensor, but got a tensor with dtype {c.dtype}")
    a, b = binary_operands(x, y, op)
    dev = same_device(op, c, a, b, labels=("condition", "x", "y"))
    named = [("condition", c), ("x", a), ("y", b)]
    dt = promote_operands(op, [("x", a), ("y", b)], named)
    shape = _broadcast(op, named)
    a, b = cast(a, dt), cast(b, dt)
    return stage1(op, [c, a, b], TensorType(dt, shape, dev))
