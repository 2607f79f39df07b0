"""Indexing ops: ``slice_tensor`` (NumPy-style ``x[...]``), ``gather``,
``gather_nd``, ``scatter`` and ``scatter_nd``.

``slice_tensor`` stores a normalised index in its attrs (``Ellipsis``
expanded, Python ints for static values, ``Dim`` bounds kept symbolic and
resolved per call), so its kernel is a plain ``x[index]`` plus flips for
negative steps (torch has no negative strides).

Index semantics (all follow NumPy):

- an int (or a ``Dim``) selects one position and drops the axis; negative
  ints count from the end; an out-of-range int on a static dim raises
  IndexError naming the axis and its size;
- a ``slice`` keeps the axis; bounds may be ints, ``Dim`` s or rank-0 integer
  ``TensorValue`` s; steps may be negative (not zero).  As in MAX, static
  bounds outside ``[-n, n]`` of a static axis and bounds running against the
  step (``x[3:1]``) are errors (its verifier messages), not clamped.  On a static dim with static bounds the result size is exact
  (``len(range(n)[s])``); on a symbolic dim it is an algebraic dim that
  assumes the bounds lie inside the axis, as the reference requires
  (``[-dim, dim]`` for positive steps, ``[-dim - 1, dim - 1]`` for negative
  ones);
- ``(slice, out_dim)`` names the result size of that slice (needed when a
  bound is a tensor); a new symbolic name is bound at execution, a known
  dim is checked at execution;
- ``None`` inserts a size-1 axis, ``...`` stands for the remaining axes;
- an integer ``TensorValue`` (or numpy array / nested list) selects along
  one axis with gather semantics; several such indices broadcast together
  and are placed as NumPy's advanced indexing places them (at the first
  one's position when they are adjacent, otherwise first).  Negative index
  values count from the end.  Boolean masks are not supported (their result
  size depends on the data; use ``ops.nonzero``/``ops.masked_scatter``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from max.dtype import DType
from max.graph.dim import Dim, StaticDim
from max.graph.ops._common import (
    as_tensor,
    broadcast_shapes,
    fail,
    normalize_axis,
    same_device,
    stage1,
)
from max.graph.shape import Shape
from max.graph.type import TensorType
from max.graph.value import TensorValue, Value

__all__ = [
    "slice_tensor", "gather", "gather_nd", "scatter", "scatter_nd",
    "scatter_add", "scatter_max", "scatter_min", "scatter_mul",
    "scatter_nd_add", "scatter_nd_max", "scatter_nd_min", "scatter_nd_mul",
]

_INT = (int, np.integer)


def _is_int(v: Any) -> bool:
    return isinstance(v, _INT) and not isinstance(v, (bool, np.bool_))


def _is_tensorish(v: Any) -> bool:
    return isinstance(v, Value) or hasattr(v, "__tensorvalue__") or hasattr(v, "_as_tensor_value") or hasattr(
        v, "_bound"
    )


def _index_tensor(v: Any, x: TensorValue, op: str, what: str, *, labels: tuple | None = None,
                  allow_bool: bool = False) -> TensorValue:
    """An integer index tensor for ``x`` (cast to int64 for the kernels).

    A float index tensor is a ValueError (MAX's ``indices.dtype=float32 must be an integer
    type.``); a bool one a TypeError (a mask is not supported), unless ``allow_bool`` reads it
    as 0/1 indices (gather_nd, as MAX does)."""
    t = as_tensor(v, op=op, arg=what, device=x.device)
    if t.dtype is DType.bool and not allow_bool:
        fail(op, f"{what}: boolean mask indices are not supported (the result size depends on the data); "
                 "use ops.nonzero or ops.where", TypeError)
    if not t.dtype.is_integral() and t.dtype is not DType.bool:
        raise ValueError(f"indices.dtype={t.dtype!r} must be an integer type. ({op}: {what})")
    if labels is not None:
        same_device(op, x, t, labels=labels)
    else:
        same_device(op, x, t)
    if t.dtype is not DType.int64:
        from max.graph.ops.elementwise import cast

        t = cast(t, DType.int64)
    return t


def _bound_value(b: Any, op: str, where: str) -> Any:
    """A slice bound: None, int, Dim, or a rank-0 integer tensor (returned as TensorValue)."""
    if b is None:
        return None
    if _is_int(b):
        return int(b)
    if isinstance(b, StaticDim):
        return b.dim
    if isinstance(b, Dim):
        return b
    if _is_tensorish(b):
        t = as_tensor(b, op=op, arg=where)
        if t.rank != 0 or not t.dtype.is_integral() or t.dtype is DType.bool:
            fail(op, f"{where} must be a rank-0 integer tensor, got {t.type}", TypeError)
        return t
    fail(op, f"{where} must be an int, Dim, rank-0 integer tensor or None, got {type(b).__name__} {b!r}",
         TypeError)


def _slice_size(dim: Dim, start: Any, stop: Any, step: int) -> Dim | None:
    """The size of ``range(dim)[start:stop:step]``; None when it cannot be known at build time."""
    if isinstance(dim, StaticDim) and all(b is None or isinstance(b, int) for b in (start, stop)):
        return StaticDim(len(range(dim.dim)[slice(start, stop, step)]))
    if any(isinstance(b, Value) for b in (start, stop)):
        return None

    def norm(b: Any, default: Dim) -> Dim:
        if b is None:
            return default
        if isinstance(b, int):
            return dim + b if b < 0 else StaticDim(b)
        return b

    if step > 0:
        lo, hi = norm(start, StaticDim(0)), norm(stop, dim)
        size = (hi - lo + (step - 1)) // step
    else:
        hi, lo = norm(start, dim - 1), norm(stop, StaticDim(-1))
        size = (hi - lo + (-step - 1)) // (-step)
    if isinstance(size, StaticDim) and size.dim < 0:
        size = StaticDim(0)
    return size


_I64 = (-(1 << 63), (1 << 63) - 1)


def _check_static_bounds(op: str, x: TensorValue, indices: Any, dim: Dim, start: Any, stop: Any,
                         step: int) -> None:
    """MAX's verifier rules for slices with static bounds (``SliceOp``), in its order:

    - the size computation must fit int64 (``rmo.slice index computation overflow``);
    - on a static axis of size n, bounds must lie in ``[-n, n]`` (``rmo.slice start index 20
      out of range for dimension size 4``; NumPy would clamp);
    - the bounds must not run against the step (``x[3:1]``, on symbolic axes too: ``rmo.slice
      start and stop should be increasing for positive step and decreasing for negative step,
      but got start 3, stop 1 for step 1``; NumPy would give an empty result).
    """
    def bad(diag: str) -> None:
        from max.graph.ops._common import op_names, verifier_fail

        verifier_fail(*op_names("slice_tensor"), [("x", x), ("indices", indices)], diag)

    ints = [b.dim if isinstance(b, StaticDim) else b for b in (start, stop)]
    ints = [b if isinstance(b, int) else None for b in ints]
    n = dim.dim if isinstance(dim, StaticDim) else None
    lo_d = ints[0] if ints[0] is not None else (0 if step > 0 else (n - 1 if n is not None else None))
    hi_d = ints[1] if ints[1] is not None else (n if step > 0 and n is not None else (-1 if step < 0 else None))
    for v in (step, lo_d, hi_d):
        if v is not None and not _I64[0] <= v <= _I64[1]:
            bad(f"rmo.slice index computation overflow: doesn't fit in an int64 (start {start}, stop {stop}, "
                f"step {step})")
    if lo_d is not None and hi_d is not None:
        span = hi_d - lo_d
        for v in (span, span + step - (1 if step > 0 else -1)):
            if not _I64[0] <= v <= _I64[1]:
                bad(f"rmo.slice index computation overflow: doesn't fit in an int64 (start {start}, stop {stop}, "
                    f"step {step})")
    norm: list = []
    for name, b in (("start", ints[0]), ("stop", ints[1])):
        if b is None:
            norm.append(None)
            continue
        if n is not None:
            if not -n <= b <= n:
                bad(f"rmo.slice {name} index {b} out of range for dimension size {n}")
            norm.append(b + n if b < 0 else b)
        else:
            norm.append(b)
    lo, hi = norm
    if lo is not None and hi is not None:
        if n is None and (ints[0] < 0) != (ints[1] < 0):
            return  # one bound counts from the (unknown) end: cannot compare
        if (hi - lo) * step < 0:
            bad("rmo.slice start and stop should be increasing for positive step and decreasing for negative "
                f"step, but got start {lo}, stop {hi} for step {step}")


def _as_index_list(indices: Any) -> list:
    if isinstance(indices, list):
        return list(indices)
    if isinstance(indices, tuple):
        # a bare ``(slice, out_dim)`` pair: x[(slice(a, b), "n")]
        if len(indices) == 2 and isinstance(indices[0], slice) and isinstance(indices[1], str):
            return [indices]
        return list(indices)
    return [indices]


def slice_tensor(x: Any, indices: Any) -> TensorValue:
    """``x[indices]`` with NumPy semantics (see the module docstring).

    Raises IndexError for too many indices, more than one ``...`` and ints out
    of range on static dims; ValueError for a zero step, a tensor bound
    without an ``out_dim`` and a static ``out_dim`` that contradicts the
    computed size; TypeError for unsupported index kinds.
    """
    op = "slice_tensor"
    x = as_tensor(x, op=op)
    items = _as_index_list(indices)
    rank = x.rank

    def consumes(e: Any) -> bool:
        return e is not None and e is not Ellipsis

    n_ell = sum(1 for e in items if e is Ellipsis)
    if n_ell > 1:
        fail(op, f"an index can only have a single ellipsis ('...'), got {indices!r}", IndexError)
    n_used = sum(1 for e in items if consumes(e))
    if n_used > rank:
        fail(op, f"too many indices for a rank-{rank} tensor {x.shape}: {n_used} axes indexed", IndexError)
    ell_at, ell_width = -1, 0
    if n_ell:
        ell_at = next(i for i, e in enumerate(items) if e is Ellipsis)
        ell_width = rank - n_used
        items[ell_at:ell_at + 1] = [slice(None)] * ell_width

    index: list = []
    operands: list[TensorValue] = [x]
    subs: list[tuple[int, int]] = []  # (index position, -1 whole entry | 0 start | 1 stop | 2 step)
    out: list = []  # result dims, with "ADV" marking where the advanced dims go
    adv_pos: list[int] = []
    adv_shapes: list[Shape] = []
    int_pos: list[int] = []
    any_neg = False
    check_shape = False
    axis = 0
    for pos, e in enumerate(items):
        if e is None:
            index.append(None)
            out.append(StaticDim(1))
            continue
        if axis >= rank:  # pragma: no cover - guarded by n_used
            fail(op, "too many indices", IndexError)
        dim = x.shape[axis]
        where = f"index {pos} (axis {axis})"
        if isinstance(e, (bool, np.bool_)):
            fail(op, f"{where}: a bool is not a valid index; use None to add an axis", TypeError)
        if _is_int(e) or isinstance(e, Dim):
            if isinstance(e, StaticDim) or _is_int(e):
                i = int(e)
                if isinstance(dim, StaticDim) and not -dim.dim <= i < dim.dim:
                    fail(op, f"index {i} is out of range for axis {axis} of size {dim.dim} "
                             f"(valid: {-dim.dim}..{dim.dim - 1})", IndexError)
                index.append(i)
            else:
                index.append(e)
            int_pos.append(pos)
            axis += 1
            continue
        out_dim = None
        if isinstance(e, tuple):
            if len(e) != 2 or not isinstance(e[0], slice):
                fail(op, f"{where}: a tuple index must be (slice, out_dim), got {e!r}", TypeError)
            e, od = e
            try:
                out_dim = Dim(od)
            except (TypeError, ValueError) as err:
                fail(op, f"{where}: out_dim {od!r} is not a valid dim: {err}", TypeError)
        if isinstance(e, slice):
            start = _bound_value(e.start, op, f"{where}: slice start")
            stop = _bound_value(e.stop, op, f"{where}: slice stop")
            step = e.step
            if step is None:
                step = 1
            elif isinstance(step, StaticDim):
                step = step.dim
            elif _is_int(step):
                step = int(step)
            else:
                fail(op, f"{where}: slice step must be a static int, got {type(step).__name__} {step!r}",
                     TypeError)
            if step == 0:
                fail(op, f"{where}: slice step cannot be zero")
            any_neg = any_neg or step < 0
            _check_static_bounds(op, x, indices, dim, start, stop, step)
            size = _slice_size(dim, start, stop, step)
            if out_dim is not None:
                if isinstance(size, StaticDim) and isinstance(out_dim, StaticDim) and size != out_dim:
                    fail(op, f"{where}: slice {e} of an axis of size {dim} has {size} elements, "
                             f"but out_dim is {out_dim}")
                if size is None or size != out_dim:
                    check_shape = True
                size = out_dim
            if size is None:
                fail(op, f"{where}: slice {e} has tensor bounds, so its size is unknown at build time; "
                         "pass (slice, out_dim) to name it")
            parts = [start, stop, step if e.step is not None else None]
            for f in (0, 1):
                if isinstance(parts[f], Value):
                    subs.append((pos, f))
                    operands.append(parts[f])
                    parts[f] = None
            index.append(slice(*parts))
            out.append(size)
            axis += 1
            continue
        if _is_tensorish(e) or isinstance(e, (np.ndarray, list)):
            t = _index_tensor(e, x, op, where)
            subs.append((pos, -1))
            operands.append(t)
            index.append(0)
            adv_pos.append(pos)
            adv_shapes.append(t.shape)
            axis += 1
            continue
        fail(op, f"{where}: unsupported index {e!r} of type {type(e).__name__}; expected an int, slice, "
                 "(slice, out_dim), None, ..., or an integer tensor", TypeError)

    # ``out`` holds the dims of the None/slice entries in order; the axes no
    # entry indexes follow unchanged.
    rest = list(x.shape[axis:])
    convert_ints: tuple = ()
    adv_front: tuple = ()
    if adv_pos:
        bshape = adv_shapes[0]
        for s in adv_shapes[1:]:
            bshape = broadcast_shapes(bshape, s, op, "tensor indices")
        # NumPy treats ints as advanced indices when a tensor index is present
        # (torch applies them first); the kernel turns them into index tensors.
        all_adv = sorted(adv_pos + int_pos)
        if int_pos and len(bshape) > 0:
            convert_ints = tuple(int_pos)
        # The broadcast index dims replace the advanced entries when those are
        # adjacent, otherwise they come first.
        # NumPy decides on the index as written, where an Ellipsis separates
        # even when it stands for no axes; torch sees the expanded index.
        orig = [p if p < ell_at or ell_at < 0 else (p - ell_width + 1 if p >= ell_at + ell_width else ell_at)
                for p in all_adv]
        adjacent = orig == list(range(orig[0], orig[0] + len(orig)))
        torch_adjacent = all_adv == list(range(all_adv[0], all_adv[-1] + 1))
        n_before = all_adv[0] if adjacent else 0  # entries before it are None/slices
        if torch_adjacent and not adjacent and all_adv[0] > 0 and len(bshape) > 0:
            adv_front = (all_adv[0], len(bshape))
        shape = Shape(out[:n_before] + list(bshape) + out[n_before:] + rest)
    else:
        shape = Shape(out + rest)

    if not subs and not any_neg and all(isinstance(e, slice) and e == slice(None) for e in index):
        return x
    attrs: dict = {"index": tuple(index)}
    if subs:
        attrs["subs"] = tuple(subs)
    if any_neg:
        attrs["flip"] = True
    if convert_ints:
        attrs["adv_ints"] = convert_ints
    if adv_front:
        attrs["adv_front"] = adv_front
    if check_shape:
        attrs["_check_shape"] = True
    return stage1(op, operands, TensorType(x.dtype, shape, x.device), attrs)


# ---------------------------------------------------------------- gather / scatter
def gather(input: Any, indices: Any, axis: int = -1) -> TensorValue:
    """Select elements of ``input`` along ``axis`` (``numpy.take`` semantics).

    The result shape is ``input.shape[:axis] + indices.shape +
    input.shape[axis+1:]``.  Negative index values count from the end of the
    axis (like NumPy); out-of-range values fail at execution.
    """
    op = "gather"
    x = as_tensor(input, op=op, arg="input")
    if x.rank == 0:
        fail(op, "input must have rank >= 1, got a rank-0 tensor")
    ax = normalize_axis(axis, x.rank, op)
    idx = _index_tensor(indices, x, op, "indices", labels=("input", "indices"))
    shape = Shape(list(x.shape[:ax]) + list(idx.shape) + list(x.shape[ax + 1:]))
    return stage1(op, [x, idx], TensorType(x.dtype, shape, x.device), {"axis": ax})


def gather_nd(input: Any, indices: Any, batch_dims: int = 0) -> TensorValue:
    """N-dimensional gather.

    ``indices.shape[-1]`` (static) is the index depth ``k``; the result shape
    is ``input.shape[:batch_dims] + indices.shape[batch_dims:-1] +
    input.shape[batch_dims + k:]``.  The first ``batch_dims`` dims of
    ``input`` and ``indices`` must be equal (no broadcasting).  Negative
    index values count from the end.  As in MAX, a depth of 0 selects all of
    ``input`` for each index vector, and bool indices are read as 0/1.
    """
    op = "gather_nd"
    x = as_tensor(input, op=op, arg="input")
    idx0 = as_tensor(indices, op=op, arg="indices", device=x.device)
    idx = _index_tensor(idx0, x, op, "indices", labels=("input", "indices"), allow_bool=True)
    if isinstance(batch_dims, bool) or not _is_int(batch_dims):
        fail(op, f"batch_dims must be an int, got {type(batch_dims).__name__} {batch_dims!r}", TypeError)
    b = int(batch_dims)
    if b < 0:
        fail(op, f"batch_dims must be >= 0, got {b}")
    if idx.rank < b + 1:
        fail(op, f"indices {idx.shape} must have rank > batch_dims ({b}): its last dim is the index vector")
    kd = idx.shape[-1]
    if not isinstance(kd, StaticDim):
        raise ValueError(f"index last dimension must be static: indices={idx0!r}")
    k = kd.dim
    for i in range(b):
        if i >= x.rank or x.shape[i] != idx.shape[i]:
            raise ValueError(f"input={x!r} and indices={idx0!r} must match up to batch_dims={b}")
    if b + k > x.rank:
        fail(op, f"batch_dims ({b}) + index depth ({k}) exceeds the rank of input {x.shape} ({x.rank})")
    shape = Shape(list(x.shape[:b]) + list(idx.shape[b:-1]) + list(x.shape[b + k:]))
    return stage1(op, [x, idx], TensorType(x.dtype, shape, x.device), {"batch_dims": b})


_SCATTER_LABELS = ("input", "updates", "indices")


def _updates(updates: Any, x: TensorValue, op: str, nd: bool) -> TensorValue:
    if isinstance(updates, TensorValue):
        u = updates
    else:
        u = as_tensor(updates, op=op, arg="updates", dtype=None if _is_tensorish(updates) else x.dtype,
                      device=x.device)
    if u.dtype is not x.dtype:
        if nd:
            raise ValueError(f"The input dtype ({x.dtype}) and updates dtype ({u.dtype}) must match")
        raise ValueError(f"The input dtype '{x.dtype}' and updates dtype '{u.dtype}' must match.")
    return u


def _scatter_indices(indices: Any, x: TensorValue, u: TensorValue, op: str) -> TensorValue:
    """int32/int64 indices only (MAX's ValueError otherwise), on the device of ``x`` and ``u``."""
    idx = as_tensor(indices, op=op, arg="indices", device=x.device)
    if idx.dtype not in (DType.int32, DType.int64):
        raise ValueError(f"Invalid indices dtype: '{idx.dtype}'. Indices must be of type int32 or int64.")
    same_device(op, x, u, idx, labels=_SCATTER_LABELS)
    if idx.dtype is not DType.int64:
        from max.graph.ops.elementwise import cast

        idx = cast(idx, DType.int64)
    return idx


def _scatter(op: str, input: Any, updates: Any, indices: Any, axis: Any) -> TensorValue:  # noqa: A002
    """The scatter family's type rule, MAX's: the input and updates dtypes must match, then the
    axis, then the indices dtype; shapes are not checked (the result has the input's type)."""
    x = as_tensor(input, op=op, arg="input")
    u = _updates(updates, x, op, nd=False)
    ax = normalize_axis(axis, x.rank, op, form="scatter")
    idx = _scatter_indices(indices, x, u, op)
    return stage1(op, [x, u, idx], x.type, {"axis": ax})


def scatter(input: Any, updates: Any, indices: Any, axis: int = -1) -> TensorValue:  # noqa: A002
    """A copy of ``input`` with ``updates`` written at ``indices`` along ``axis``.

    ``out[..., indices[i, j, ...], ...] = updates[i, j, ...]`` (the index
    replaces position ``axis``), i.e. ``torch.scatter`` / ONNX
    ScatterElements.  ``indices`` and ``updates`` have the same shape and the
    same rank as ``input``; their dims other than ``axis`` must not exceed
    ``input``'s (as in MAX these shapes are not checked while the graph is
    built).  Negative index values count from the end.  With duplicate
    indices which update wins is unspecified.
    """
    return _scatter("scatter", input, updates, indices, axis)


def scatter_add(input: Any, updates: Any, indices: Any, axis: int = -1) -> TensorValue:  # noqa: A002
    """Like :func:`scatter`, but duplicates accumulate: ``out[... idx ...] += updates``."""
    return _scatter("scatter_add", input, updates, indices, axis)


def scatter_max(input: Any, updates: Any, indices: Any, axis: int = -1) -> TensorValue:  # noqa: A002
    """Like :func:`scatter`, keeping the maximum of ``input`` and every update at a position."""
    return _scatter("scatter_max", input, updates, indices, axis)


def scatter_min(input: Any, updates: Any, indices: Any, axis: int = -1) -> TensorValue:  # noqa: A002
    """Like :func:`scatter`, keeping the minimum of ``input`` and every update at a position."""
    return _scatter("scatter_min", input, updates, indices, axis)


def scatter_mul(input: Any, updates: Any, indices: Any, axis: int = -1) -> TensorValue:  # noqa: A002
    """Like :func:`scatter`, multiplying ``input`` by every update at a position."""
    return _scatter("scatter_mul", input, updates, indices, axis)


def _scatter_nd(op: str, input: Any, updates: Any, indices: Any) -> TensorValue:  # noqa: A002
    """MAX's type rule: the input and updates dtypes must match, then the indices dtype and
    the devices; shapes are not checked (the result has the input's type)."""
    x = as_tensor(input, op=op, arg="input")
    u = _updates(updates, x, op, nd=True)
    idx = _scatter_indices(indices, x, u, op)
    return stage1(op, [x, u, idx], x.type)


def scatter_nd(input: Any, updates: Any, indices: Any) -> TensorValue:  # noqa: A002
    """A copy of ``input`` with slices replaced: ``out[tuple(indices[j])] = updates[j]``.

    ``indices`` has shape ``[..., k]`` with a static index depth
    ``k <= input.rank`` (``k == rank`` writes elements, ``k < rank`` writes
    slices); ``updates`` has shape ``indices.shape[:-1] + input.shape[k:]``
    (as in MAX these shapes are not checked while the graph is built).
    Negative index values count from the end.  With duplicate indices which
    update wins is unspecified.
    """
    return _scatter_nd("scatter_nd", input, updates, indices)


def scatter_nd_add(input: Any, updates: Any, indices: Any) -> TensorValue:  # noqa: A002
    """Like :func:`scatter_nd`, but duplicates accumulate: ``out[tuple(indices[j])] += updates[j]``."""
    return _scatter_nd("scatter_nd_add", input, updates, indices)


def scatter_nd_max(input: Any, updates: Any, indices: Any) -> TensorValue:  # noqa: A002
    """Like :func:`scatter_nd`, keeping the maximum of ``input`` and every update at a position."""
    return _scatter_nd("scatter_nd_max", input, updates, indices)


def scatter_nd_min(input: Any, updates: Any, indices: Any) -> TensorValue:  # noqa: A002
    """Like :func:`scatter_nd`, keeping the minimum of ``input`` and every update at a position."""
    return _scatter_nd("scatter_nd_min", input, updates, indices)


def scatter_nd_mul(input: Any, updates: Any, indices: Any) -> TensorValue:  # noqa: A002
    """Like :func:`scatter_nd`, multiplying ``input`` by every update at a position."""
    return _scatter_nd("scatter_nd_mul", input, updates, indices)
