"""Signal and data-dependent ops: ``irfft``, ``nonzero`` and ``masked_scatter``.

``irfft`` is the inverse of a real FFT along one axis (``numpy.fft.irfft``
semantics): the output length is ``n`` (default ``2 * (m - 1)`` for an input
of length ``m``), the input is truncated or zero-padded to ``n // 2 + 1``
bins, and ``normalization`` is ``"backward"`` (divide by ``n``),
``"ortho"`` (divide by ``sqrt(n)``) or ``"forward"`` (no scaling).  With
``input_is_complex`` the input's last dim (size 2) holds (real, imag) pairs
and ``axis`` counts among the other dims; otherwise the input is the real
part (imaginary part zero).  ``buffer_size_mb`` is accepted and ignored (the
torch FFT manages its own workspace).  Half-precision inputs are computed in
float32 and cast back.

``nonzero`` and ``masked_scatter`` take ``out_dim``, the data-dependent
number of selected (non-zero / true) elements.  For ``nonzero`` it is the
result's first dim: a new symbolic name is bound when the graph runs (later
ops can use it), a static or already-known dim is checked then.  For
``masked_scatter`` (whose result has the input's shape) a static ``out_dim``
is checked against the mask when the graph runs; a symbolic one documents
the count.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from max.dtype import DType
from max.graph.dim import Dim, StaticDim
from max.graph.ops._common import as_tensor, broadcast_shapes, fail, is_scalar_like, normalize_axis, same_device, stage1
from max.graph.shape import Shape
from max.graph.type import TensorType
from max.graph.value import TensorValue

__all__ = ["Normalization", "irfft", "masked_scatter", "nonzero"]


class Normalization(str, enum.Enum):
    """FFT normalisation modes (``numpy.fft`` names)."""

    BACKWARD = "backward"
    ORTHO = "ortho"
    FORWARD = "forward"

    def __str__(self) -> str:
        return self.value


def irfft(
    input_tensor: Any,
    n: int | None = None,
    axis: int = -1,
    normalization: Any = Normalization.BACKWARD,
    input_is_complex: bool = False,
    buffer_size_mb: int = 512,
) -> TensorValue:
    """Inverse real FFT of ``input_tensor`` along ``axis`` (see the module docstring).

    Raises TypeError for scalar/ndarray or non-float input and a non-int
    ``n``; ValueError for ``n < 1``, a bad normalization, a complex input
    whose last dim is not 2; IndexError for ``axis`` out of range.
    """
    op = "irfft"
    if is_scalar_like(input_tensor) or isinstance(input_tensor, np.ndarray):
        fail(op, f"input_tensor must be a tensor value, Dim or Shape, got {type(input_tensor).__name__}",
             TypeError)
    x = as_tensor(input_tensor, op=op, arg="input_tensor")
    if not x.dtype.is_float():
        fail(op, f"input_tensor must be a floating-point tensor, got {x.dtype}", TypeError)
    dims = list(x.shape)
    if input_is_complex:
        if x.rank < 2 or dims[-1] != 2:
            fail(op, f"input_is_complex=True needs a last dim of size 2 (real, imag) and rank >= 2, got {x.shape}")
        dims = dims[:-1]
    elif x.rank < 1:
        fail(op, f"input_tensor must have rank >= 1, got {x.type}")
    a = normalize_axis(axis, len(dims), op)
    if n is not None:
        if isinstance(n, StaticDim):
            n = n.dim
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            fail(op, f"n must be an int or None, got {type(n).__name__} {n!r}", TypeError)
        n = int(n)
        length: Dim = StaticDim(n)
    else:
        length = 2 * (dims[a] - 1)
    if isinstance(length, StaticDim) and length.dim < 1:
        fail(op, f"the output length n must be positive, got {length.dim}"
                 + ("" if n is not None else f" (2 * ({dims[a]} - 1) for an axis of size {dims[a]})"))
    try:
        norm = Normalization(normalization)
    except ValueError:
        fail(op, f"normalization must be 'backward', 'ortho' or 'forward', got {normalization!r}")
    if isinstance(buffer_size_mb, bool) or not isinstance(buffer_size_mb, (int, np.integer)) or buffer_size_mb < 0:
        fail(op, f"buffer_size_mb must be a non-negative int, got {buffer_size_mb!r}", TypeError)
    dims[a] = length
    attrs = {"n": length, "axis": a, "norm": norm.value, "input_is_complex": bool(input_is_complex)}
    return stage1(op, [x], TensorType(x.dtype, Shape(dims), x.device), attrs)


def _out_dim(out_dim: Any, op: str) -> Dim:
    if out_dim is None:
        fail(op, "out_dim is required: it names the data-dependent number of selected elements", TypeError)
    try:
        d = Dim(out_dim)
    except (TypeError, ValueError) as e:
        fail(op, f"out_dim {out_dim!r} is not a valid dim: {e}", TypeError)
        raise AssertionError
    if isinstance(d, StaticDim) and d.dim < 0:
        fail(op, f"out_dim must be non-negative, got {d.dim}")
    return d


def nonzero(x: Any, out_dim: Any) -> TensorValue:
    """The int64 ``[out_dim, rank]`` indices of ``x``'s non-zero elements, in row-major order.

    ``out_dim`` names the count (a new symbolic name is bound when the graph
    runs; a static value is checked then).  Raises ValueError for a rank-0
    input.
    """
    op = "nonzero"
    x = as_tensor(x, op=op)
    if x.rank < 1:
        fail(op, f"x must have rank >= 1, got a scalar {x.type}")
    d = _out_dim(out_dim, op)
    if isinstance(d, StaticDim):
        total = 1
        for s in x.shape:
            total = total * s
        if isinstance(total, StaticDim) and d.dim > total.dim:
            fail(op, f"out_dim={d.dim} exceeds the number of elements of x {x.shape} ({total.dim})")
    attrs = {"count": d.dim if isinstance(d, StaticDim) else None}
    return stage1(op, [x], TensorType(DType.int64, Shape([d, x.rank]), x.device), attrs)


def masked_scatter(input: Any, mask: Any, updates: Any, out_dim: Any) -> TensorValue:  # noqa: A002
    """``input`` with the positions where ``mask`` is true filled, in row-major order, from ``updates``.

    ``mask`` broadcasts with ``input`` (the result has their broadcast
    shape); ``updates`` is read flattened and must hold at least as many
    elements as there are true positions.  ``out_dim`` names that count.
    Raises TypeError for a non-bool mask or dtype mismatches, ValueError
    when a static ``out_dim`` exceeds the size of ``updates``.
    """
    op = "masked_scatter"
    x = as_tensor(input, op=op, arg="input")
    m = as_tensor(mask, op=op, arg="mask", dtype=DType.bool, device=x.device)
    u = as_tensor(updates, op=op, arg="updates", dtype=x.dtype, device=x.device)
    dev = same_device(op, x, m, u)
    if m.dtype is not DType.bool:
        fail(op, f"mask must be a bool tensor, got {m.dtype}", TypeError)
    if u.dtype is not x.dtype:
        fail(op, f"updates dtype {u.dtype} differs from input dtype {x.dtype}", ValueError)
    shape = broadcast_shapes(x.shape, m.shape, op, "input and mask")
    d = _out_dim(out_dim, op)
    usize: Dim = StaticDim(1)
    for s in u.shape:
        usize = usize * s
    if isinstance(d, StaticDim) and isinstance(usize, StaticDim) and d.dim > usize.dim:
        fail(op, f"out_dim={d.dim} true positions but updates {u.shape} holds only {usize.dim} elements")
    attrs = {"shape": shape, "count": d.dim if isinstance(d, StaticDim) else None}
    return stage1(op, [x, m, u], TensorType(x.dtype, shape, dev), attrs)
