"""Shape ops: reshape, transpose/permute, squeeze/unsqueeze, broadcast_to,
flatten, concat/stack, split/chunk, tile, pad, rebind, repeat_interleave,
band_part and shape_to_tensor.

Type rules propagate symbolic dims: ``concat`` of ``[a, 4]`` and ``[b, 4]``
along axis 0 gives ``[a + b, 4]``, ``tile`` of ``[n]`` by 3 gives ``[n * 3]``.
Dims that must agree (``concat``'s other axes, ``stack``'s shapes) compare
by value, so equal symbolic names/expressions match and different names do
not.

Axis errors are MAX's (one helper, :func:`max.graph.ops._common.normalize_axis`):
IndexError ``Axis out of range (expected to be in range of [-3, 2], but got -4)``
(``transpose`` names ``axis_1``/``axis_2``), ``split`` IndexError ``Axis must be in
range [-1, 1), got 2``, and ``repeat_interleave`` the same text as a ValueError (as
its reference documents).

Decisions where the reference text is ambiguous:

* ``chunk`` requires ``chunks`` to divide the axis size exactly (as its
  parameter text says: "chunks must statically evenly divide"); its example
  (5 elements into ``[1, 2], [3, 4]``) contradicts both that text and
  ``torch.chunk``, so it is not followed: that call raises ValueError.
* ``band_part``: ``num_lower``/``num_upper`` must be ``None`` or
  ``0 <= n <= size - 1`` of the matching static dim (``M`` for ``num_lower``,
  ``N`` for ``num_upper``); a symbolic dim only bounds them below by 0.
* ``pad``: paddings must be non-negative ints (no cropping).
* ``tile``: ``repeats`` must have one entry per dim (no implicit leading 1s).
* ``rebind``: the rank and static dims are checked at build time where both
  sides are static; everything else is checked when the graph runs, with
  ``message`` in the error.
"""

from __future__ import annotations

import builtins

from typing import Any, Sequence

import numpy as np

from max.dtype import DType
from max.graph.dim import Dim, StaticDim, SymbolicDim, _mono_mul
from max.graph.ops._common import as_shape, as_tensor, fail, normalize_axis, same_device, stage, stage1, verifier_fail
from max.graph.shape import Shape
from max.graph.type import DeviceRef, TensorType
from max.graph.value import TensorValue

__all__ = [
    "band_part",
    "broadcast_to",
    "chunk",
    "concat",
    "flatten",
    "pad",
    "permute",
    "rebind",
    "repeat_interleave",
    "reshape",
    "shape_to_tensor",
    "split",
    "squeeze",
    "stack",
    "tile",
    "transpose",
    "unsqueeze",
]


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _axis(axis: Any, rank: int, op: str, arg: str = "axis", form: str = "index") -> int:
    """Normalise ``axis`` for a tensor of ``rank`` dims (negative counts from the end)."""
    return normalize_axis(axis, rank, op, arg, form)


def _int_arg(v: Any, op: str, arg: str) -> int:
    if not _is_int(v):
        fail(op, f"{arg} must be an int, got {type(v).__name__} {v!r}", TypeError)
    return int(v)


def _dims_arg(values: Any, op: str, arg: str) -> list[Dim]:
    """A sequence of DimLike (int / str / Dim) as Dims."""
    if isinstance(values, TensorValue) or isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        fail(op, f"{arg} must be a sequence of ints/dims, got {type(values).__name__} {values!r}", TypeError)
    out = []
    for v in values:
        if isinstance(v, (bool, np.bool_)):
            fail(op, f"{arg} must hold ints or dims, got bool {v!r} in {list(values)!r}", TypeError)
        try:
            out.append(Dim(v))
        except (TypeError, ValueError) as e:
            fail(op, f"{arg}: {e}", TypeError)
    return out


def _num_elements(shape: Shape) -> Dim:
    n: Dim = StaticDim(1)
    for d in shape:
        n = n * d
    return n


def _exact_div(a: Dim, b: Dim) -> Dim | None:
    """``a / b`` when ``b`` is a single term (``c * n * m ...``) dividing every term of ``a``; else
    ``a // b`` if that is exact (None when it is not)."""
    pb = b._poly()
    if len(pb) == 1:
        ((mb, cb),) = pb.items()
        need = dict(mb)
        out: dict = {}
        for ma, ca in a._poly().items():
            have = dict(ma)
            if ca % cb or any(have.get(atom, 0) < p for atom, p in need.items()):
                break
            rest = {atom: p - need.get(atom, 0) for atom, p in have.items() if p - need.get(atom, 0)}
            mono = _mono_mul(tuple(rest.items()), ())  # canonical atom order
            out[mono] = out.get(mono, 0) + ca // cb
        else:
            q = Dim._from_poly({m: c for m, c in out.items() if c})
            if q * b == a:
                return q
    q = a // b
    return q if q * b == a else None


def _result(x: TensorValue, shape: Any, dtype: DType | None = None) -> TensorType:
    return TensorType(dtype or x.dtype, shape, x.device)


# ------------------------------------------------------------------ reshape
def reshape(x: Any, shape: Any) -> TensorValue:
    """Same elements in row-major order, new shape; one ``-1`` is inferred.

    Raises ValueError when the element counts differ (MAX's verifier message, with its
    hint to rebind) and when a -1 sits next to a 0 dim.
    """
    op = "reshape"
    x = as_tensor(x, op=op)
    raw = list(shape) if not isinstance(shape, Shape) else list(shape)
    minus = [i for i, d in enumerate(raw) if (isinstance(d, (int,)) and not isinstance(d, bool) and d == -1)
             or (isinstance(d, StaticDim) and d.dim == -1)]
    if len(minus) > 1:
        fail(op, f"at most one -1 is allowed in the target shape, got {raw}")
    total = _num_elements(x.shape)

    def mismatch(target: Any) -> None:
        verifier_fail("ReshapeOp", "rmo.reshape", [("x", x), ("shape", target)],
                      f"[reshape] input and output number of elements must match: input {x.shape._text()} has "
                      f"{total} elements, output {Shape(target)._text()} has {_num_elements(Shape(target))}",
                      "If you are confident this is correct, consider a rebind to assert that the reshape is valid")

    if minus:
        rest = [d for i, d in enumerate(raw) if i != minus[0]]
        known = _num_elements(as_shape(rest, op))
        if known == 0:
            raise ValueError("reshape(): cannot infer -1 dimension when another dimension is 0")
        inferred = _exact_div(total, known)
        if inferred is None or inferred * known != total:
            mismatch(raw)
        raw[minus[0]] = inferred
    target = as_shape(raw, op)
    for d in target:
        if isinstance(d, StaticDim) and d.dim < 0:
            fail(op, f"dims must be non-negative (or a single -1), got {raw}")
    if _num_elements(target) != total:
        mismatch(target)
    if target == x.shape:
        return x
    return stage1(op, [x], TensorType(x.dtype, target, x.device), {"shape": target})


def shape_to_tensor(shape: Any) -> TensorValue:
    """A 1-D int64 tensor holding the (possibly symbolic) dims of ``shape``.

    As in MAX, a string is read as a sequence of dim names (``"ab"`` is ``[a, b]``; a name
    that is not valid is a ValueError) and a non-iterable is a TypeError."""
    if isinstance(shape, str):
        shape = [Dim(c) for c in shape]
    elif not isinstance(shape, TensorValue):
        iter(shape)  # TypeError: 'int' object is not iterable
    shp = as_shape(shape, "shape_to_tensor")
    return stage1(
        "shape_to_tensor", [], TensorType(DType.int64, [len(shp)], DeviceRef.CPU()), {"shape": shp}
    )


# ------------------------------------------------------------ axis shuffles
def transpose(x: Any, axis_1: int, axis_2: int) -> TensorValue:
    """Swap two axes (negative axes count from the end)."""
    op = "transpose"
    x = as_tensor(x, op=op)
    # a scalar has one "axis" (0 or -1) to swap with itself, as torch and MAX allow
    a = _axis(axis_1, builtins.max(x.rank, 1), op, "axis_1")
    b = _axis(axis_2, builtins.max(x.rank, 1), op, "axis_2")
    if x.rank == 0 or a == b:
        return x
    shp = list(x.shape)
    shp[a], shp[b] = shp[b], shp[a]
    return stage1(op, [x], _result(x, shp), {"axis_1": a, "axis_2": b})


def permute(x: Any, dims: Sequence[int]) -> TensorValue:
    """Reorder all axes: result dim ``i`` is input dim ``dims[i]`` (negative entries count from the end)."""
    op = "permute"
    x = as_tensor(x, op=op)
    if isinstance(dims, (str, bytes)) or not hasattr(dims, "__iter__"):
        fail(op, f"dims must be a list of ints, got {type(dims).__name__} {dims!r}", TypeError)
    dims = list(dims)
    if len(dims) != x.rank:
        fail(op, f"dims {dims} must name each of the {x.rank} axes of {x.shape} exactly once "
                 f"(got {len(dims)} entries)")
    perm = [_axis(d, x.rank, op, "dims entry") for d in dims]
    if len(set(perm)) != len(perm):
        fail(op, f"dims {dims} is not a permutation of 0..{x.rank - 1}: repeated axes")
    if perm == list(range(x.rank)):
        return x
    return stage1(op, [x], _result(x, [x.shape[p] for p in perm]), {"dims": tuple(perm)})


def squeeze(x: Any, axis: int) -> TensorValue:
    """Remove the size-1 dim at ``axis``."""
    op = "squeeze"
    x = as_tensor(x, op=op)
    a = _axis(axis, x.rank, op)
    d = x.shape[a]
    if d != 1:
        fail(op, f"dim {a} of {x.shape} is {d}; only a (static) size-1 dim can be removed")
    return stage1(op, [x], _result(x, x.shape[:a] + x.shape[a + 1:]), {"axis": a})


def unsqueeze(x: Any, axis: int) -> TensorValue:
    """Insert a static size-1 dim at ``axis`` (negative axes count from rank + 1)."""
    op = "unsqueeze"
    x = as_tensor(x, op=op)
    a = _axis(axis, x.rank + 1, op)
    return stage1(op, [x], _result(x, x.shape[:a] + [1] + x.shape[a:]), {"axis": a})


def flatten(x: Any, start_dim: int = 0, end_dim: int = -1) -> TensorValue:
    """Merge dims ``start_dim..end_dim`` (inclusive) into one; a rank-0 tensor becomes ``[1]``."""
    op = "flatten"
    x = as_tensor(x, op=op)
    rank = x.rank
    if rank == 0:
        _axis(start_dim, 1, op, "start_dim")
        _axis(end_dim, 1, op, "end_dim")
        return reshape(x, [1])
    s = _axis(start_dim, rank, op, "start_dim")
    e = _axis(end_dim, rank, op, "end_dim")
    if s > e:
        fail(op, f"start_dim={start_dim} comes after end_dim={end_dim} for a rank-{rank} tensor")
    if s == e:
        return x
    merged = _num_elements(x.shape[s:e + 1])
    shp = x.shape[:s] + [merged] + x.shape[e + 1:]
    return stage1(op, [x], _result(x, shp), {"start_dim": s, "end_dim": e})


# ---------------------------------------------------------------- broadcast
def broadcast_to(x: Any, shape: Any, out_dims: Any = None) -> TensorValue:
    """Broadcast ``x`` to ``shape``: aligned from the right, each dim of ``x`` is 1 or equals the target's.

    ``shape`` may be a 1-D integer tensor, in which case ``out_dims`` gives the
    result's dims (checked against the tensor's values when the graph runs).
    """
    op = "broadcast_to"
    x = as_tensor(x, op=op)
    dynamic = isinstance(shape, TensorValue) or hasattr(shape, "__tensorvalue__")
    if dynamic:
        if out_dims is None:
            fail(op, "a tensor-valued shape needs out_dims (the result's dims)")
        shape_t = as_tensor(shape, op=op, arg="shape")
        target = Shape(_dims_arg(out_dims, op, "out_dims"))
        if shape_t.rank != 1:
            fail(op, f"a tensor-valued shape must be 1-D, got {shape_t.type}")
        if not (shape_t.dtype.is_signed_integral() or shape_t.dtype.is_unsigned_integral()):
            fail(op, f"a tensor-valued shape must hold integers, got {shape_t.dtype.name}", TypeError)
        if shape_t.shape[0] != len(target):
            fail(op, f"shape tensor has {shape_t.shape[0]} entries but out_dims {target} has {len(target)}")
    else:
        target = Shape(_dims_arg(shape, op, "shape"))
        if out_dims is not None and Shape(_dims_arg(out_dims, op, "out_dims")) != target:
            fail(op, f"out_dims {list(out_dims)} differs from shape {target}")
    for d in target:
        if isinstance(d, StaticDim) and d.dim < 0:
            fail(op, f"target dims must be non-negative, got {target}")
    if x.rank > len(target):
        fail(op, f"cannot broadcast {x.shape} (rank {x.rank}) to {target} (rank {len(target)}): "
                 "the target has fewer dims")
    off = len(target) - x.rank
    for i, d in enumerate(x.shape):
        t = target[off + i]
        if d != 1 and d != t:
            verifier_fail("BroadcastToOp", "rmo.broadcast_to", [("x", x), ("shape", target)],
                          f"[broadcast_to] input dimension at index {i} ({d}) must be either 1 or equal to "
                          f"corresponding output dimension at index {off + i} ({t})")
    if dynamic:
        expect = tuple(d.dim if isinstance(d, StaticDim) else None for d in target)
        return stage1(op, [x, shape_t], _result(x, target),
                      {"expect": expect, "_check_shape": True})
    if target == x.shape:
        return x
    return stage1(op, [x], _result(x, target), {"shape": target})


# -------------------------------------------------------------- concat/stack
def _tensor_list(values: Any, op: str, arg: str) -> list[TensorValue]:
    if isinstance(values, TensorValue) or not hasattr(values, "__iter__") or isinstance(values, (str, bytes)):
        fail(op, f"{arg} must be a list of tensors, got {type(values).__name__}", TypeError)
    vals = [as_tensor(v, op=op, arg=f"{arg}[{i}]") for i, v in enumerate(values)]
    if not vals:
        fail(op, f"{arg} must not be empty")
    return vals


def _same_dtype(vals: list[TensorValue], op: str, arg: str) -> None:
    for i, v in enumerate(vals[1:], 1):
        if v.dtype is not vals[0].dtype:
            fail(op, f"all {arg} must have the same dtype: {arg}[0] is {vals[0].dtype.name}, "
                     f"{arg}[{i}] is {v.dtype.name}", ValueError)


def _differ_on_non_concat_axis(types: list[TensorType], a: int) -> None:
    """MAX's ValueError when the inputs of a concat differ on an axis other than ``a``."""
    for k in range(types[0].rank):
        if k != a and any(t.shape[k] != types[0].shape[k] for t in types[1:]):
            shown = ", ".join(f"TensorValue(dtype={t.dtype!r}, shape={t.shape!r}, device={t.device!r})"
                              for t in types)
            raise ValueError(f"Concat inputs differ on non-concat axis {k}: vals=[{shown}]")


def concat(original_vals: Any, axis: int = 0) -> TensorValue:
    """Join tensors along an existing axis; the other dims must be equal (symbolic dims by name)."""
    op = "concat"
    vals = _tensor_list(original_vals, op, "original_vals")
    _same_dtype(vals, op, "original_vals")
    same_device(op, *vals)
    rank = vals[0].rank
    a = _axis(axis, rank, op)
    for i, v in enumerate(vals[1:], 1):
        if v.rank != rank:
            fail(op, f"all original_vals must have the same rank: original_vals[0] is {vals[0].shape}, "
                     f"original_vals[{i}] is {v.shape}")
    _differ_on_non_concat_axis([v.type for v in vals], a)
    if len(vals) == 1:
        return vals[0]
    total: Dim = StaticDim(0)
    for v in vals:
        total = total + v.shape[a]
    shp = list(vals[0].shape)
    shp[a] = total
    return stage1(op, vals, _result(vals[0], shp), {"axis": a})


def stack(values: Any, axis: int = 0) -> TensorValue:
    """Join equal-shaped tensors along a new axis (negative axes count from rank + 1).

    MAX's errors, in its order: ``Expected at least one value to stack``, ``All inputs to
    stack must be the same rank``, ``All inputs to stack must have the same dtype``, the
    axis (``Axis out of range ...``, counted on the result's rank), then ``Concat inputs
    differ on non-concat axis k: vals=[...]`` (k counts the new axis)."""
    op = "stack"
    if isinstance(values, TensorValue) or not hasattr(values, "__iter__") or isinstance(values, (str, bytes)):
        fail(op, f"values must be a list of tensors, got {type(values).__name__}", TypeError)
    vals = [as_tensor(v, op=op, arg=f"values[{i}]") for i, v in enumerate(values)]
    if not vals:
        raise ValueError("Expected at least one value to stack")
    if any(v.rank != vals[0].rank for v in vals[1:]):
        raise ValueError("All inputs to stack must be the same rank")
    if any(v.dtype is not vals[0].dtype for v in vals[1:]):
        raise ValueError("All inputs to stack must have the same dtype")
    same_device(op, *vals)
    a = _axis(axis, vals[0].rank + 1, op)
    if any(v.shape != vals[0].shape for v in vals[1:]):
        _differ_on_non_concat_axis([_result(v, v.shape[:a] + [1] + v.shape[a:]) for v in vals], a)
    shp = vals[0].shape[:a] + [len(vals)] + vals[0].shape[a:]
    return stage1(op, vals, _result(vals[0], shp), {"axis": a})


# --------------------------------------------------------------- split/chunk
def _split(x: TensorValue, sizes: list[Dim], a: int) -> list[TensorValue]:
    if len(sizes) == 1:
        return [x]
    types = []
    for s in sizes:
        shp = list(x.shape)
        shp[a] = s
        types.append(_result(x, shp))
    return stage("split", [x], types, {"split_sizes": tuple(sizes), "axis": a, "_multi": True})


def split(x: Any, split_sizes: Sequence[Any], axis: int = 0) -> list[TensorValue]:
    """Split ``x`` along ``axis`` into pieces of ``split_sizes`` (which must sum to that dim).

    As in MAX the sizes are static ints (a symbolic size is MAX's TypeError ``int(Dim('n')):
    Int conversions only supported for static dims``); a negative size is ValueError
    ``Split sizes must be positive: ...``, a wrong total ``Split sizes must sum to dimension
    value; ...`` (a symbolic axis never equals a static total)."""
    op = "split"
    x = as_tensor(x, op=op)
    a = _axis(axis, x.rank, op, form="split")
    if isinstance(split_sizes, TensorValue) or isinstance(split_sizes, (str, bytes)) or not hasattr(
            split_sizes, "__iter__"):
        fail(op, f"split_sizes must be a sequence of ints, got {type(split_sizes).__name__}", TypeError)
    sizes = []
    for v in split_sizes:
        if isinstance(v, (bool, np.bool_)):
            fail(op, f"split_sizes must hold ints, got bool {v!r}", TypeError)
        sizes.append(int(Dim(v)))
    if not sizes:
        fail(op, "split_sizes must not be empty")
    if any(v < 0 for v in sizes):
        raise ValueError(f"Split sizes must be positive: sizes={sizes}")
    if x.shape[a] != builtins.sum(sizes):
        raise ValueError(f"Split sizes must sum to dimension value; x.shape[axis]={x.shape[a]!r} != sum(sizes={sizes})")
    return _split(x, [StaticDim(v) for v in sizes], a)


def chunk(x: Any, chunks: int, axis: int = 0) -> list[TensorValue]:
    """Split ``x`` into ``chunks`` equal pieces along ``axis``.

    As in MAX the axis must be static (a symbolic one is its TypeError ``int(Dim('n')): ...``)
    and ``chunks`` must divide it: ValueError ``chunk: chunks=2 must statically divide
    x.shape[axis]=Dim(1)``."""
    op = "chunk"
    x = as_tensor(x, op=op)
    n = _int_arg(chunks, op, "chunks")
    a = _axis(axis, x.rank, op)
    d = x.shape[a]
    size_total = int(d)
    if n <= 0:
        fail(op, f"chunks must be positive, got {n}")
    if size_total % n:
        raise ValueError(f"chunk: chunks={n} must statically divide x.shape[axis]={d!r}")
    size = StaticDim(size_total // n)
    if n == 1:
        return [x]
    # staged as its own op so the kernel needs no (possibly unbound) symbolic sizes
    types = []
    for _ in range(n):
        shp = list(x.shape)
        shp[a] = size
        types.append(_result(x, shp))
    return stage(op, [x], types, {"chunks": n, "axis": a, "_multi": True})


# ----------------------------------------------------------------- tile/pad
def tile(x: Any, repeats: Sequence[Any]) -> TensorValue:
    """Repeat the whole tensor ``repeats[i]`` times along each dim ``i``."""
    op = "tile"
    x = as_tensor(x, op=op)
    reps = _dims_arg(repeats, op, "repeats")
    if len(reps) != x.rank:
        fail(op, f"repeats {[str(r) for r in reps]} must have one entry per dim of {x.shape} "
                 f"({x.rank}), got {len(reps)}")
    for r in reps:
        if isinstance(r, StaticDim) and r.dim < 1:
            fail(op, f"repeats must be positive, got {[str(r) for r in reps]}")
    if all(r == 1 for r in reps):
        return x
    shp = [d * r for d, r in zip(x.shape, reps)]
    return stage1(op, [x], _result(x, shp), {"repeats": tuple(reps)})


_PAD_MODES = ("constant", "reflect", "edge")


def pad(input: Any, paddings: Sequence[int], mode: str = "constant", value: Any = 0) -> TensorValue:  # noqa: A002
    """Pad ``input``: ``paddings = [before_0, after_0, before_1, after_1, ...]``.

    Modes (NumPy's ``np.pad`` names): ``'constant'`` fills with ``value``;
    ``'reflect'`` mirrors the values next to the edge, the edge itself not
    repeated (pads longer than the dim reflect again, as ``np.pad`` does);
    ``'edge'`` repeats the edge value.  As in MAX the result shape is the
    input's plus the pads in every mode; padding an empty dim in ``'reflect'``
    or ``'edge'`` mode builds but fails when run (there is no value to repeat).
    """
    op = "pad"
    x = as_tensor(input, op=op, arg="input")
    if mode not in _PAD_MODES:
        raise ValueError(f"unsupported padding mode {mode!r}; expected 'constant', 'reflect', or 'edge'")
    if isinstance(paddings, (str, bytes, TensorValue)) or not hasattr(paddings, "__iter__"):
        fail(op, f"paddings must be a sequence of ints, got {type(paddings).__name__}", TypeError)
    pads = [_int_arg(p, op, "paddings entry") for p in paddings]
    if len(pads) != 2 * x.rank:
        fail(op, f"paddings {pads} must have 2 entries (before, after) per dim of {x.shape}: "
                 f"expected {2 * x.rank}, got {len(pads)}")
    if any(p < 0 for p in pads):
        fail(op, f"paddings must be non-negative, got {pads}")
    shp = [d + pads[2 * i] + pads[2 * i + 1] for i, d in enumerate(x.shape)]
    if mode != "constant":
        if not any(pads):
            return x
        return stage1(op, [x], _result(x, shp), {"paddings": tuple(pads), "mode": mode})
    attrs: dict = {"paddings": tuple(pads)}
    operands = [x]
    if isinstance(value, (bool, np.bool_, int, float, np.integer, np.floating)):
        v = value.item() if isinstance(value, np.generic) else value
        if x.dtype is DType.bool:
            if not isinstance(v, bool) and v not in (0, 1):
                fail(op, f"value={value!r} does not fit a bool tensor", ValueError)
            v = bool(v)
        elif not x.dtype.is_float():
            if isinstance(v, float):
                if not float(v).is_integer():
                    fail(op, f"value={value!r} is not a whole number but input is {x.dtype.name}", TypeError)
                v = int(v)
            info = np.iinfo(x.dtype.to_numpy())
            if not info.min <= int(v) <= info.max:
                fail(op, f"value={value!r} does not fit {x.dtype.name}")
            v = int(v)
        else:
            v = float(v)
        attrs["value"] = v
    else:
        val = as_tensor(value, op=op, arg="value", dtype=x.dtype, device=x.device)
        if val.rank != 0:
            fail(op, f"value must be a scalar, got {val.type}")
        if val.dtype is not x.dtype:
            from max.graph.ops.elementwise import cast

            val = cast(val, x.dtype)
        same_device(op, x, val)
        operands.append(val)
    if not any(pads):
        return x
    return stage1(op, operands, _result(x, shp), attrs)


# -------------------------------------------------------------------- rebind
def rebind(x: Any, shape: Any, message: str = "", layout: Any = None) -> TensorValue:
    """The same tensor with type ``shape``; the shape is asserted when the graph runs.

    New symbolic names in ``shape`` are bound to the runtime sizes; known ones
    (and static dims) are checked, and a mismatch raises with ``message``.
    """
    op = "rebind"
    x = as_tensor(x, op=op)
    if not isinstance(message, str):
        fail(op, f"message must be a str, got {type(message).__name__}", TypeError)
    target = Shape(_dims_arg(shape, op, "shape"))
    for d in target:
        if isinstance(d, StaticDim) and d.dim < 0:
            fail(op, f"dims must be non-negative, got {target}")
    why = f" ({message})" if message else ""
    if len(target) != x.rank:
        fail(op, f"cannot rebind {x.shape} (rank {x.rank}) to {target} (rank {len(target)}){why}")
    for i, (d, t) in enumerate(zip(x.shape, target)):
        if isinstance(d, StaticDim) and isinstance(t, StaticDim) and d != t:
            fail(op, f"cannot rebind {x.shape} to {target}: dim {i} is statically {d}, not {t}{why}")
    if target == x.shape:
        return x
    # What the kernel checks per call: ints (static dims), Dims whose names are
    # bound by then (evaluated per call), names of new symbols (equal names
    # must get equal sizes), None (new-symbol expressions; the lowering's
    # shape check binds/validates those).
    known = {d.name for d in x.shape if isinstance(d, SymbolicDim)}
    try:
        from max.graph.graph import Graph

        g = Graph.current
        while g is not None:
            for t in getattr(g, "_input_types", ()):
                for d in getattr(t, "shape", ()):
                    if isinstance(d, SymbolicDim):
                        known.add(d.name)
            g = getattr(g, "_enclosing", None)
    except RuntimeError:
        pass
    expect: list = []
    for d in target:
        if isinstance(d, StaticDim):
            expect.append(d.dim)
        elif all(p.name in known for p in d.parameters):
            expect.append(d)
        elif isinstance(d, SymbolicDim):
            expect.append(d.name)
        else:
            expect.append(None)
    attrs = {"expect": tuple(expect), "message": message, "_check_shape": True}
    if layout is not None:
        attrs["_layout"] = layout
    return stage1(op, [x], _result(x, target), attrs)


# --------------------------------------------------------- repeat_interleave
_FRESH = 0


def repeat_interleave(x: Any, repeats: Any, axis: int | None = None, out_dim: Any = None) -> TensorValue:
    """Repeat each element ``repeats`` times along ``axis`` (``torch.repeat_interleave``).

    ``axis=None`` flattens first.  ``repeats`` is a positive int, a list/array
    of positive ints (one per element along ``axis``, or a single one), or a
    1-D integer tensor, which needs ``out_dim`` (the result's size along axis).
    """
    op = "repeat_interleave"
    x = as_tensor(x, op=op)
    if axis is None:
        if x.rank != 1:
            x = reshape(x, [_num_elements(x.shape)])
        a = 0
    else:
        if not _is_int(axis):
            fail(op, f"axis must be an int or None, got {type(axis).__name__} {axis!r}", TypeError)
        a = _axis(axis, x.rank, op, form="value")
    d = x.shape[a]
    od = None if out_dim is None else _dims_arg([out_dim], op, "out_dim")[0]
    operands = [x]
    if _is_int(repeats):
        r = int(repeats)
        if r <= 0:
            fail(op, f"repeats must be positive, got {r}")
        size = d * r
        if od is not None and od != size and isinstance(od, StaticDim) and isinstance(size, StaticDim):
            fail(op, f"out_dim={od} differs from the result size {size} ({d} * {r})")
        attrs: dict = {"repeats": r, "axis": a}
    elif isinstance(repeats, (list, tuple, np.ndarray)):
        arr = np.asarray(repeats)
        if arr.ndim > 1 or arr.size == 0 or arr.dtype.kind not in "iu":
            fail(op, f"repeats must be an int or a 1-D list of ints, got {repeats!r}", TypeError)
        arr = arr.reshape(-1).astype(np.int64)
        if (arr <= 0).any():
            fail(op, f"repeats must be positive, got {arr.tolist()}")
        if arr.size == 1:
            return repeat_interleave(x, int(arr[0]), a, out_dim)
        if d != arr.size:
            fail(op, f"repeats has {arr.size} entries but dim {a} of {x.shape} is {d}")
        size = StaticDim(int(arr.sum()))
        if od is not None and od != size and isinstance(od, StaticDim):
            fail(op, f"out_dim={od} differs from the result size {size} (the sum of repeats)")
        from max.graph.ops.constant import constant

        operands.append(constant(arr, DType.int64, x.device))
        attrs = {"axis": a}
    else:
        rep = as_tensor(repeats, op=op, arg="repeats")
        if rep._node.op == "constant" and rep.dtype.is_integral():
            # a constant repeats tensor: its values give a static result size
            return repeat_interleave(x, rep._node.attrs["value"].reshape(-1), a, out_dim)
        if od is None:
            # the size depends on the data: name it with a fresh symbolic dim, bound at execution
            global _FRESH
            _FRESH += 1
            od = Dim(f"repeat_interleave_{_FRESH}")
        if not (rep.dtype.is_signed_integral() or rep.dtype.is_unsigned_integral()):
            fail(op, f"repeats must be an integer tensor, got {rep.dtype.name}", TypeError)
        if rep.rank > 1:
            fail(op, f"repeats must be a scalar or 1-D tensor, got {rep.type}")
        if rep.rank == 1 and rep.shape[0] != 1 and rep.shape[0] != d and isinstance(rep.shape[0], StaticDim) \
                and isinstance(d, StaticDim):
            fail(op, f"repeats has {rep.shape[0]} entries but dim {a} of {x.shape} is {d}")
        same_device(op, x, rep)
        if rep.dtype is not DType.int64:
            from max.graph.ops.elementwise import cast

            rep = cast(rep, DType.int64)
        operands.append(rep)
        size = od
        attrs = {"axis": a, "expect": od.dim if isinstance(od, StaticDim) else None, "_check_shape": True}
    shp = list(x.shape)
    shp[a] = size
    return stage1(op, operands, _result(x, shp), attrs)


# ----------------------------------------------------------------- band_part
def band_part(x: Any, num_lower: int | None = None, num_upper: int | None = None,
              exclude: bool = False) -> TensorValue:
    """Keep the band ``-num_lower <= n - m <= num_upper`` of the last two axes (``None``: unbounded),
    zeroing the rest; ``exclude=True`` zeroes the band instead."""
    op = "band_part"
    x = as_tensor(x, op=op)
    if x.rank < 2:
        fail(op, f"x must have rank >= 2 (the last two axes are the matrix), got {x.shape}")
    for name, v, dim in (("num_lower", num_lower, x.shape[-2]), ("num_upper", num_upper, x.shape[-1])):
        if v is None:
            continue
        n = _int_arg(v, op, name)
        if n == -1:
            continue  # -1, like None, keeps the whole triangle
        if n < 0:
            fail(op, f"{name}={n} must be non-negative, or -1/None for the whole triangle")
        if isinstance(dim, StaticDim) and n > max(dim.dim - 1, 0):
            fail(op, f"{name}={n} is out of range for a matrix dim of size {dim} "
                     f"(valid: 0..{max(dim.dim - 1, 0)}, or None)")
    if not isinstance(exclude, (bool, np.bool_)):
        fail(op, f"exclude must be a bool, got {type(exclude).__name__}", TypeError)
    attrs = {
        "num_lower": None if num_lower is None or int(num_lower) == -1 else int(num_lower),
        "num_upper": None if num_upper is None or int(num_upper) == -1 else int(num_upper),
        "exclude": bool(exclude),
    }
    return stage1(op, [x], _result(x, x.shape), attrs)
