"""Pooling and resizing: ``max_pool2d``, ``avg_pool2d`` (NHWC), ``resize`` /
``resize_bicubic`` (NCHW) and ``resize_linear`` / ``resize_nearest`` (any rank).

Pooling output size per spatial axis (PyTorch's rule, symbolic dims
propagate as expressions)::

    out = (size + 2 * padding - dilation * (k - 1) - 1 [+ stride - 1 if ceil_mode]) // stride + 1

and with ``ceil_mode`` the last window is dropped when it would start in the
right padding (``(out - 1) * stride >= size + padding``).  On a symbolic
axis that correction cannot be decided at build time, so ``ceil_mode`` there
needs ``padding + stride <= dilation * (k - 1) + 1`` (when the correction
can never apply) or static spatial dims.

Decisions where the reference text is ambiguous:

* ``max_pool2d`` padding positions never win (they act as ``-inf``, as in
  PyTorch and ONNX); the reference calls them "0-paddings", wording shared
  with ``avg_pool2d`` where they are zeros.
* ``avg_pool2d(count_boundary=True)`` divides by the window's extent clipped
  to the padded input (PyTorch's ``count_include_pad``); with
  ``count_boundary=False`` by the number of real input elements.  A window
  lying entirely in padding yields 0 (avg) or ``-inf`` (max).
* Pooling requires floating-point input; ``kernel_size``, ``stride``,
  ``dilation`` and ``padding`` must be static (a single int is repeated).
* ``resize`` follows the reference: rank-4 NCHW input, ``shape`` with four
  entries whose batch and channel entries equal the input's, and only
  ``InterpolationMode.BICUBIC`` (PyTorch's bicubic, a = -0.75,
  half-pixel centres, i.e. ``align_corners=False``); the other modes raise
  NotImplementedError as documented (the kernel understands them, so
  enabling them is a one-line change), as does a single int ``shape``.
  ``resize_bicubic(input, shape)`` is the same op.
* ``resize_linear`` / ``resize_nearest`` resize every dim whose size
  changes (ONNX Resize semantics).  An output coordinate ``o`` maps to the
  input coordinate ``x`` by ``coordinate_transformation_mode``:
  ``half_pixel`` ``(o + 0.5) / scale - 0.5``; ``pytorch_half_pixel`` the same
  but 0 for a length-1 output; ``align_corners`` ``o * (in - 1) / (out - 1)``;
  ``asymmetric`` ``o / scale`` (``scale = out / in``).  Linear interpolation
  clamps ``x`` to the input; with ``antialias`` a downsampled axis uses a
  tent filter stretched by ``1 / scale`` (PyTorch's ``antialias=True``).
  Nearest rounds ``x`` by ``round_mode``: ``half_down`` (``ceil(x - 0.5)``),
  ``half_up`` (``floor(x + 0.5)``), ``floor`` or ``ceil``, then clamps.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from max.graph.dim import Dim, StaticDim
from max.graph.ops._common import as_tensor, fail, stage1
from max.graph.ops.conv import int_tuple
from max.graph.shape import Shape
from max.graph.type import TensorType
from max.graph.value import TensorValue

__all__ = [
    "InterpolationMode", "avg_pool2d", "max_pool2d", "resize", "resize_bicubic", "resize_linear",
    "resize_nearest",
]


class InterpolationMode(str, enum.Enum):
    """Interpolation modes for :func:`resize` (only BICUBIC is implemented)."""

    BICUBIC = "bicubic"
    BILINEAR = "bilinear"
    NEAREST = "nearest"

    def __str__(self) -> str:
        return self.value


def _kernel_size(v: Any, op: str) -> tuple[int, int]:
    if isinstance(v, (list, tuple)):
        out = []
        for e in v:
            if isinstance(e, (str, Dim)):
                try:
                    d = Dim(e)
                except (TypeError, ValueError) as err:
                    fail(op, f"kernel_size entry {e!r}: {err}", TypeError)
                if not isinstance(d, StaticDim):
                    fail(op, f"kernel_size must be static, got symbolic dim {d}")
                out.append(d.dim)  # type: ignore[union-attr]
            else:
                out.append(e)
        v = tuple(out)
    return int_tuple(v, 2, op, "kernel_size", minimum=1)  # type: ignore[return-value]


def _pool_size(op: str, axis: str, size: Dim, k: int, s: int, d: int, p: int, ceil_mode: bool) -> Dim:
    eff = d * (k - 1) + 1
    if isinstance(size, StaticDim):
        n = size.dim
        out = (n + 2 * p - eff + (s - 1 if ceil_mode else 0)) // s + 1
        if ceil_mode and (out - 1) * s >= n + p:
            out -= 1
        if out < 1:
            fail(op, f"the {axis} axis of size {n} (padding {p}) is smaller than the dilated kernel "
                     f"({d} * ({k} - 1) + 1 = {eff}): the output would have {out} elements")
        return StaticDim(out)
    if ceil_mode and p + s > eff:
        fail(op, f"ceil_mode on the symbolic {axis} axis {size} needs padding + stride <= dilation * (kernel - 1) + 1 "
                 f"({p} + {s} > {eff}), or a static size")
    return (size + 2 * p - eff + (s - 1 if ceil_mode else 0)) // s + 1


def _pool(op: str, input: Any, kernel_size: Any, stride: Any, dilation: Any, padding: Any,  # noqa: A002
          ceil_mode: Any, extra: dict) -> TensorValue:
    x = as_tensor(input, op=op, arg="input")
    if x.rank != 4:
        fail(op, f"input must have rank 4 (NHWC), got {x.type}")
    if not x.dtype.is_float():
        fail(op, f"input must be a floating-point tensor, got {x.dtype}", TypeError)
    k = _kernel_size(kernel_size, op)
    s = int_tuple(stride, 2, op, "stride", minimum=1)
    d = int_tuple(dilation, 2, op, "dilation", minimum=1)
    p = int_tuple(padding, 2, op, "padding", minimum=0)
    if not isinstance(ceil_mode, (bool, np.bool_)):
        fail(op, f"ceil_mode must be a bool, got {ceil_mode!r}", TypeError)
    n, h, w, c = x.shape
    oh = _pool_size(op, "H", h, k[0], s[0], d[0], p[0], bool(ceil_mode))
    ow = _pool_size(op, "W", w, k[1], s[1], d[1], p[1], bool(ceil_mode))
    attrs = {"kernel_size": k, "stride": s, "dilation": d, "padding": p, "ceil_mode": bool(ceil_mode),
             "out_hw": Shape([oh, ow]), **extra}
    return stage1(op, [x], TensorType(x.dtype, Shape([n, oh, ow, c]), x.device), attrs)


def max_pool2d(
    input: Any,  # noqa: A002
    kernel_size: Any,
    stride: Any = 1,
    dilation: Any = 1,
    padding: Any = 0,
    ceil_mode: bool = False,
) -> TensorValue:
    """2-D max pooling over an ``[N, H, W, C]`` tensor (see the module docstring for sizes)."""
    return _pool("max_pool2d", input, kernel_size, stride, dilation, padding, ceil_mode, {})


def avg_pool2d(
    input: Any,  # noqa: A002
    kernel_size: Any,
    stride: Any = 1,
    dilation: Any = 1,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_boundary: bool = True,
) -> TensorValue:
    """2-D average pooling over an ``[N, H, W, C]`` tensor; ``count_boundary`` counts padding in the divisor."""
    op = "avg_pool2d"
    if not isinstance(count_boundary, (bool, np.bool_)):
        fail(op, f"count_boundary must be a bool, got {count_boundary!r}", TypeError)
    return _pool(op, input, kernel_size, stride, dilation, padding, ceil_mode,
                 {"count_boundary": bool(count_boundary)})


def resize(input: Any, shape: Any, interpolation: Any = InterpolationMode.BILINEAR) -> TensorValue:  # noqa: A002
    """Resize an NCHW tensor to ``shape`` (``[N, C, H_out, W_out]``) by bicubic interpolation.

    Raises ValueError when the input is not rank 4, ``shape`` does not have 4
    entries (or changes N or C), or ``interpolation`` is not an
    InterpolationMode; NotImplementedError for a single int ``shape`` and
    for modes other than BICUBIC.
    """
    op = "resize"
    x = as_tensor(input, op=op, arg="input")
    if x.rank != 4:
        fail(op, f"input must have rank 4 (NCHW), got {x.type}")
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        fail(op, f"a single int size ({shape}) is not supported; pass the full [N, C, H, W] shape",
             NotImplementedError)
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        fail(op, f"shape must be an iterable of 4 dims, got {type(shape).__name__} {shape!r}", TypeError)
    try:
        dims = [Dim(v) for v in shape]
    except (TypeError, ValueError) as e:
        fail(op, f"shape {shape!r}: {e}", TypeError)
    if len(dims) != 4:
        fail(op, f"shape must have 4 entries [N, C, H, W], got {len(dims)}: {dims}")
    try:
        mode = InterpolationMode(interpolation)
    except ValueError:
        fail(op, f"interpolation must be an InterpolationMode, got {interpolation!r}")
    if mode is not InterpolationMode.BICUBIC:
        fail(op, f"interpolation {mode.name} is not implemented; only InterpolationMode.BICUBIC is",
             NotImplementedError)
    if not x.dtype.is_float():
        fail(op, f"input must be a floating-point tensor, got {x.dtype}", TypeError)
    for i, name in ((0, "batch"), (1, "channel")):
        if dims[i] != x.shape[i]:
            fail(op, f"shape {dims} changes the {name} dim ({x.shape[i]} -> {dims[i]}); "
                     "only H and W are resized")
    for i in (2, 3):
        if isinstance(dims[i], StaticDim) and dims[i].dim < 1:  # type: ignore[union-attr]
            fail(op, f"output sizes must be positive, got {dims}")
    attrs = {"size": Shape(dims[2:]), "mode": mode.value}
    return stage1(op, [x], TensorType(x.dtype, Shape(dims), x.device), attrs)



def resize_bicubic(input: Any, shape: Any) -> TensorValue:  # noqa: A002
    """Bicubic resize of an NCHW tensor to ``shape`` (``resize`` with ``InterpolationMode.BICUBIC``)."""
    return resize(input, shape, InterpolationMode.BICUBIC)


_COORD_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
_ROUND_MODES = ("half_down", "half_up", "floor", "ceil")


def _mode_name(v: Any, allowed: tuple, op: str, arg: str) -> str:
    name = getattr(v, "value", v)
    if isinstance(name, str):
        name = name.lower()
    if name not in allowed:
        fail(op, f"{arg}={v!r} is not supported; use one of {list(allowed)}")
    return name


def _resize_shape(op: str, x: TensorValue, shape: Any) -> list[Dim]:
    if isinstance(shape, (str, bytes, TensorValue)) or not hasattr(shape, "__iter__"):
        fail(op, f"shape must be an iterable of dims (one per input dim), got {type(shape).__name__} {shape!r}",
             TypeError)
    try:
        dims = [Dim(v) for v in shape]
    except (TypeError, ValueError) as e:
        fail(op, f"shape {shape!r}: {e}", TypeError)
    if len(dims) != x.rank:
        fail(op, f"shape {dims} must have one entry per dim of input {x.shape} ({x.rank}), got {len(dims)}")
    for i, (d, o) in enumerate(zip(x.shape, dims)):
        if isinstance(o, StaticDim) and o.dim < 1:
            fail(op, f"output sizes must be positive, got {dims}")
        if d != o and not isinstance(d, StaticDim):
            fail(op, f"dim {i} of input {x.shape} is symbolic ({d}); only static dims can be resized")
        if d != o and isinstance(d, StaticDim) and d.dim == 0:
            fail(op, f"dim {i} of input {x.shape} is empty and cannot be resized to {o}")
    if not x.dtype.is_float():
        fail(op, f"input must be a floating-point tensor, got {x.dtype}", TypeError)
    return dims


def resize_linear(input: Any, shape: Any, coordinate_transformation_mode: Any = "half_pixel",  # noqa: A002
                  antialias: bool = False) -> TensorValue:
    """Linear resize of every dim whose size changes (see the module docstring)."""
    op = "resize_linear"
    x = as_tensor(input, op=op, arg="input")
    dims = _resize_shape(op, x, shape)
    mode = _mode_name(coordinate_transformation_mode, _COORD_MODES, op, "coordinate_transformation_mode")
    if not isinstance(antialias, (bool, np.bool_)):
        fail(op, f"antialias must be a bool, got {type(antialias).__name__}", TypeError)
    if all(d == o for d, o in zip(x.shape, dims)):
        return x
    attrs = {"size": Shape(dims), "coordinate_transformation_mode": mode, "antialias": bool(antialias)}
    return stage1(op, [x], TensorType(x.dtype, Shape(dims), x.device), attrs)


def resize_nearest(input: Any, shape: Any, coordinate_transformation_mode: Any = "half_pixel",  # noqa: A002
                   round_mode: Any = "half_down") -> TensorValue:
    """Nearest-neighbour resize of every dim whose size changes (see the module docstring)."""
    op = "resize_nearest"
    x = as_tensor(input, op=op, arg="input")
    dims = _resize_shape(op, x, shape)
    mode = _mode_name(coordinate_transformation_mode, _COORD_MODES, op, "coordinate_transformation_mode")
    rmode = _mode_name(round_mode, _ROUND_MODES, op, "round_mode")
    if all(d == o for d, o in zip(x.shape, dims)):
        return x
    attrs = {"size": Shape(dims), "coordinate_transformation_mode": mode, "round_mode": rmode}
    return stage1(op, [x], TensorType(x.dtype, Shape(dims), x.device), attrs)
