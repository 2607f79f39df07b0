"""Convolutions: ``conv2d``, ``conv2d_transpose``, ``conv3d`` and ``fold`` (col2im).

Layouts.  The input is channels-last by default (``ConvInputLayout.NHWC``:
``[N, H, W, C]``, or ``[N, D, H, W, C]`` for 3-D) or channels-first
(``NCHW``: ``[N, C, H, W]`` / ``[N, C, D, H, W]``); the result uses the same
layout as the input.  The filter layout names its axes by letter: ``Q R S``
are the spatial axes (depth, height, width), ``C`` the input channels per
group and ``F`` the output channels.  2-D convolutions take ``RSCF``
(default), ``FCRS`` (PyTorch's order) or ``CFRS``; 3-D ones ``QRSCF``
(default) or ``FCQRS``.  For ``conv2d_transpose`` the letters follow the
reference's text: ``RSCF`` is ``(kh, kw, out_channels, in_channels)``, so
``C`` is the *output* and ``F`` the *input* channel count (``FCRS`` is then
PyTorch's ``ConvTranspose2d`` weight order).

Padding is ``(dim1_before, dim1_after, dim2_before, dim2_after, ...)`` over
the spatial dims in order; asymmetric padding is supported.  Output sizes
(symbolic dims propagate as expressions)::

    conv:       (size + before + after - dilation * (k - 1) - 1) // stride + 1
    transpose:  (size - 1) * stride + dilation * (k - 1) + 1 - before - after + output_padding

Decisions where the reference text is ambiguous:

* ``conv2d_transpose`` follows ONNX/PyTorch semantics: the full transposed
  convolution is cropped by ``before``/``after`` and then extended by
  ``output_paddings`` at the end of each spatial axis (with ``after == 0``
  these are zeros plus bias, which is what the reference's text describes).
  Non-zero ``output_paddings`` are accepted (the reference says only 0 is
  supported by its kernels); there is no ``groups`` parameter, as in the
  reference.
* Strides and dilations must be positive, paddings and output paddings
  non-negative; a single int is accepted where a tuple is documented and is
  repeated for every spatial dim.
* Input and filter must have the same floating-point dtype (and bias too).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from max.graph.dim import Dim, StaticDim
from max.graph.ops._common import as_tensor, fail, same_device, stage1
from max.graph.shape import Shape
from max.graph.type import ConvInputLayout, FilterLayout, TensorType
from max.graph.value import TensorValue

__all__ = ["conv2d", "conv2d_transpose", "conv3d", "fold"]

_FILTER_LAYOUTS = {
    2: (FilterLayout.RSCF, FilterLayout.FCRS, FilterLayout.CFRS),
    3: (FilterLayout.QRSCF, FilterLayout.FCQRS),
}
_SPATIAL_LETTERS = {2: "RS", 3: "QRS"}


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def int_tuple(v: Any, n: int, op: str, name: str, *, minimum: int) -> tuple[int, ...]:
    """``v`` as ``n`` ints >= ``minimum`` (a single int is repeated)."""
    if isinstance(v, StaticDim):
        v = v.dim
    if _is_int(v):
        vals: list = [int(v)] * n
    elif isinstance(v, (list, tuple)):
        vals = [e.dim if isinstance(e, StaticDim) else e for e in v]
        if not all(_is_int(e) for e in vals):
            fail(op, f"{name} must be an int or a tuple of {n} ints, got {v!r}", TypeError)
        if len(vals) != n:
            fail(op, f"{name} must have {n} entries, got {len(vals)}: {tuple(vals)}")
        vals = [int(e) for e in vals]
    else:
        fail(op, f"{name} must be an int or a tuple of {n} ints, got {type(v).__name__} {v!r}", TypeError)
        raise AssertionError
    bad = [e for e in vals if e < minimum]
    if bad:
        what = "positive" if minimum == 1 else "non-negative"
        fail(op, f"{name} must be {what}, got {tuple(vals)}")
    return tuple(vals)


def _input_layout(layout: Any, op: str) -> ConvInputLayout:
    try:
        return ConvInputLayout(layout)
    except ValueError:
        fail(op, f"input_layout must be a ConvInputLayout (NHWC or NCHW), got {layout!r}")
        raise AssertionError


def _filter_layout(layout: Any, nd: int, op: str) -> FilterLayout:
    allowed = _FILTER_LAYOUTS[nd]
    try:
        fl = FilterLayout(layout)
    except ValueError:
        fl = None
    if fl not in allowed:
        fail(op, f"filter_layout {layout!r} is not valid for a {nd}-D convolution; "
                 f"use one of {', '.join(a.value for a in allowed)}")
    return fl  # type: ignore[return-value]


def _float_operand(v: TensorValue, op: str, arg: str) -> None:
    if not v.dtype.is_float():
        fail(op, f"{arg} must be a floating-point tensor, got {v.dtype}", TypeError)


def _out_size(op: str, axis: str, size: Dim, k: Dim, s: int, d: int, before: int, after: int) -> Dim:
    out = (size + before + after - d * (k - 1) - 1) // s + 1
    if isinstance(out, StaticDim) and out.dim < 1:
        fail(op, f"the {axis} axis of size {size} (padded by {before}+{after}) is smaller than the dilated "
                 f"kernel ({d} * ({k} - 1) + 1): the output would have {out.dim} elements")
    return out


def _conv_common(op: str, nd: int, x: Any, filter: Any, stride: Any, dilation: Any, padding: Any,  # noqa: A002
                 bias: Any, input_layout: Any, filter_layout: Any):
    x = as_tensor(x, op=op, arg="x")
    w = as_tensor(filter, op=op, arg="filter", dtype=x.dtype, device=x.device)
    il = _input_layout(input_layout, op)
    fl = _filter_layout(filter_layout, nd, op)
    if x.rank != nd + 2:
        what = "NDHWC/NCDHW" if nd == 3 else "NHWC/NCHW"
        fail(op, f"x must have rank {nd + 2} ({what}), got {x.type}")
    if w.rank != nd + 2:
        fail(op, f"filter must have rank {nd + 2} ({fl.value}), got {w.type}")
    _float_operand(x, op, "x")
    if w.dtype is not x.dtype:
        fail(op, f"filter dtype {w.dtype} differs from x dtype {x.dtype}", TypeError)
    dev = same_device(op, x, w)
    strides = int_tuple(stride, nd, op, "stride", minimum=1)
    dils = int_tuple(dilation, nd, op, "dilation", minimum=1)
    pads = int_tuple(padding, 2 * nd, op, "padding", minimum=0)
    if il is ConvInputLayout.NHWC:
        n, spatial, c = x.shape[0], list(x.shape[1:-1]), x.shape[-1]
    else:
        n, c, spatial = x.shape[0], x.shape[1], list(x.shape[2:])
    letters = fl.value
    fdims = {ch: w.shape[letters.index(ch)] for ch in letters}
    kernel = [fdims[ch] for ch in _SPATIAL_LETTERS[nd]]
    b = None
    if bias is not None:
        b = as_tensor(bias, op=op, arg="bias", dtype=x.dtype, device=x.device)
        same_device(op, x, b)
        if b.dtype is not x.dtype:
            fail(op, f"bias dtype {b.dtype} differs from x dtype {x.dtype}", TypeError)
    return x, w, b, il, fl, dev, strides, dils, pads, n, spatial, c, fdims, kernel


def _check_bias(op: str, b: TensorValue | None, out_channels: Dim) -> None:
    if b is not None and (b.rank != 1 or b.shape[0] != out_channels):
        fail(op, f"bias must have shape [{out_channels}] (the output channels), got {b.shape}")


def _assemble(il: ConvInputLayout, n: Dim, spatial: Sequence[Dim], c: Dim) -> Shape:
    if il is ConvInputLayout.NHWC:
        return Shape([n, *spatial, c])
    return Shape([n, c, *spatial])


def _conv_nd(op: str, nd: int, x: Any, filter: Any, stride: Any, dilation: Any, padding: Any,  # noqa: A002
             groups: Any, bias: Any, input_layout: Any, filter_layout: Any) -> TensorValue:
    x, w, b, il, fl, dev, strides, dils, pads, n, spatial, c, fdims, kernel = _conv_common(
        op, nd, x, filter, stride, dilation, padding, bias, input_layout, filter_layout)
    if not _is_int(groups) or int(groups) < 1:
        fail(op, f"groups must be a positive int, got {groups!r}", TypeError if not _is_int(groups) else ValueError)
    g = int(groups)
    cpg, f = fdims["C"], fdims["F"]
    if cpg * g != c:
        fail(op, f"x has {c} input channels but filter {w.shape} ({fl.value}) has {cpg} channels per group "
                 f"x {g} group(s) = {cpg * g}")
    if isinstance(f, StaticDim) and f.dim % g != 0:
        fail(op, f"filter has {f} output channels, which is not divisible by groups={g}")
    names = ("D", "H", "W")[3 - nd:]
    out_sp = [
        _out_size(op, names[i], spatial[i], kernel[i], strides[i], dils[i], pads[2 * i], pads[2 * i + 1])
        for i in range(nd)
    ]
    _check_bias(op, b, f)
    attrs = {
        "stride": strides,
        "dilation": dils,
        "padding": pads,
        "groups": g,
        "input_layout": il.value,
        "filter_layout": fl.value,
    }
    operands = [x, w] + ([b] if b is not None else [])
    return stage1(op, operands, TensorType(x.dtype, _assemble(il, n, out_sp, f), dev), attrs)


def conv2d(
    x: Any,
    filter: Any,  # noqa: A002 - reference name
    stride: Any = (1, 1),
    dilation: Any = (1, 1),
    padding: Any = (0, 0, 0, 0),
    groups: int = 1,
    bias: Any = None,
    input_layout: ConvInputLayout = ConvInputLayout.NHWC,
    filter_layout: FilterLayout = FilterLayout.RSCF,
) -> TensorValue:
    """2-D convolution of ``x`` (NHWC or NCHW) with ``filter`` (RSCF, FCRS or CFRS).

    ``padding`` is ``(h_before, h_after, w_before, w_after)``; the input
    channels must equal the filter's channels-per-group times ``groups`` and
    the output channels must be divisible by ``groups``; ``bias`` has shape
    ``(out_channels,)``.  Raises ValueError for rank/channel/layout/size
    mismatches and non-positive strides/dilations, TypeError for non-float or
    mismatched dtypes.
    """
    return _conv_nd("conv2d", 2, x, filter, stride, dilation, padding, groups, bias, input_layout, filter_layout)


def conv3d(
    x: Any,
    filter: Any,  # noqa: A002
    stride: Any = (1, 1, 1),
    dilation: Any = (1, 1, 1),
    padding: Any = (0, 0, 0, 0, 0, 0),
    groups: int = 1,
    bias: Any = None,
    input_layout: ConvInputLayout = ConvInputLayout.NHWC,
    filter_layout: FilterLayout = FilterLayout.QRSCF,
) -> TensorValue:
    """3-D convolution of ``x`` (NDHWC, or NCDHW with ``input_layout=NCHW``) with ``filter`` (QRSCF or FCQRS).

    ``padding`` is ``(d_before, d_after, h_before, h_after, w_before, w_after)``;
    otherwise as :func:`conv2d`.
    """
    return _conv_nd("conv3d", 3, x, filter, stride, dilation, padding, groups, bias, input_layout, filter_layout)


def conv2d_transpose(
    x: Any,
    filter: Any,  # noqa: A002
    stride: Any = (1, 1),
    dilation: Any = (1, 1),
    padding: Any = (0, 0, 0, 0),
    output_paddings: Any = (0, 0),
    bias: Any = None,
    input_layout: ConvInputLayout = ConvInputLayout.NHWC,
    filter_layout: FilterLayout = FilterLayout.RSCF,
) -> TensorValue:
    """Transposed 2-D convolution (the gradient of ``conv2d`` with respect to its input).

    ``filter`` in RSCF is ``(kh, kw, out_channels, in_channels)``; ``x``'s
    channels must equal the filter's ``in_channels``.  ``padding`` crops the
    full result ``(h_before, h_after, w_before, w_after)``; ``output_paddings``
    adds that many rows/columns at the end of H/W (see the module docstring).
    """
    op = "conv2d_transpose"
    x, w, b, il, fl, dev, strides, dils, pads, n, spatial, c, fdims, kernel = _conv_common(
        op, 2, x, filter, stride, dilation, padding, bias, input_layout, filter_layout)
    ops_ = int_tuple(output_paddings, 2, op, "output_paddings", minimum=0)
    cin, cout = fdims["F"], fdims["C"]
    if cin != c:
        fail(op, f"x has {c} input channels but filter {w.shape} ({fl.value}: kh, kw, out, in) expects {cin}")
    out_sp = []
    for i, name in enumerate(("H", "W")):
        size = (spatial[i] - 1) * strides[i] + dils[i] * (kernel[i] - 1) + 1 - pads[2 * i] - pads[2 * i + 1] + ops_[i]
        if isinstance(size, StaticDim) and size.dim < 1:
            fail(op, f"the {name} output size would be {size.dim}: padding {pads[2 * i]}+{pads[2 * i + 1]} "
                     f"crops more than the full output")
        out_sp.append(size)
    _check_bias(op, b, cout)
    attrs = {
        "stride": strides,
        "dilation": dils,
        "padding": pads,
        "output_paddings": ops_,
        "input_layout": il.value,
        "filter_layout": fl.value,
    }
    operands = [x, w] + ([b] if b is not None else [])
    return stage1(op, operands, TensorType(x.dtype, _assemble(il, n, out_sp, cout), dev), attrs)


def _dim_pair(v: Any, op: str, name: str) -> tuple[Dim, Dim]:
    if isinstance(v, (list, tuple, Shape)) and len(v) == 2:
        try:
            return Dim(v[0]), Dim(v[1])
        except (TypeError, ValueError) as e:
            fail(op, f"{name} {v!r}: {e}", TypeError)
    fail(op, f"{name} must be a tuple of two dims, got {v!r}", TypeError)
    raise AssertionError


def fold(
    input: Any,  # noqa: A002
    output_size: Any,
    kernel_size: Any,
    stride: Any = 1,
    dilation: Any = 1,
    padding: Any = 0,
) -> TensorValue:
    """Combine sliding blocks ``(N, C * kh * kw, L)`` into ``(N, C, H, W)`` (col2im; overlaps add up).

    ``L`` must equal the number of block positions
    ``prod((output_size[d] + 2 * padding[d] - dilation[d] * (kernel_size[d] - 1) - 1) // stride[d] + 1)``.
    ``kernel_size`` and ``output_size`` may be symbolic (then the checks that need their values
    run when the graph runs; the channel dim becomes ``input.shape[1] // (kh * kw)``).
    """
    op = "fold"
    x = as_tensor(input, op=op, arg="input")
    if x.rank != 3:
        fail(op, f"input must have rank 3 (N, C * kernel_sizes, L), got {x.type}")
    out_hw = _dim_pair(output_size, op, "output_size")
    ks = _dim_pair(kernel_size, op, "kernel_size")
    for d, name in zip(ks, ("kernel_size[0]", "kernel_size[1]")):
        if isinstance(d, StaticDim) and d.dim < 1:
            fail(op, f"kernel_size must be positive, got {tuple(str(k) for k in ks)}")
    hw = f"({out_hw[0]}, {out_hw[1]})"
    for d, name in zip(out_hw, ("output_size[0]", "output_size[1]")):
        if isinstance(d, StaticDim) and d.dim < 1:
            fail(op, f"{name} must be positive, got {d.dim}")
    s = int_tuple(stride, 2, op, "stride", minimum=1)
    dl = int_tuple(dilation, 2, op, "dilation", minimum=1)
    p = int_tuple(padding, 2, op, "padding", minimum=0)
    if not x.dtype.is_float():
        fail(op, f"input must be a floating-point tensor, got {x.dtype}", TypeError)
    n, ck, length = x.shape
    static_k = all(isinstance(k, StaticDim) for k in ks)
    kprod = ks[0] * ks[1]
    if isinstance(ck, StaticDim) and static_k:
        if ck.dim % kprod.dim != 0:  # type: ignore[attr-defined]
            fail(op, f"input dim 1 ({ck}) must be a multiple of the kernel size product {ks[0]} * {ks[1]} = {kprod}")
        c: Dim = StaticDim(ck.dim // kprod.dim)  # type: ignore[attr-defined]
    else:
        c = ck // kprod
    blocks = [
        (out_hw[i] + 2 * p[i] - dl[i] * (ks[i] - 1) - 1) // s[i] + 1 for i in range(2)
    ]
    for i, bl in enumerate(blocks):
        if isinstance(bl, StaticDim) and bl.dim < 1:
            fail(op, f"output_size {hw} with padding {p} is smaller than the dilated kernel "
                     f"along axis {i}: no block fits")
    expected = blocks[0] * blocks[1]
    kdesc = f"({ks[0]}, {ks[1]})"
    if isinstance(expected, StaticDim) and isinstance(length, StaticDim):
        if expected != length:
            fail(op, f"input has L={length} blocks but output_size {hw}, kernel_size {kdesc}, "
                     f"stride {s}, dilation {dl}, padding {p} give {blocks[0]} * {blocks[1]} = {expected}")
    elif expected != length and not (expected.parameters or length.parameters):
        fail(op, f"input has L={length} blocks but the sizes give {expected}")
    attrs = {
        "output_size": Shape(list(out_hw)),
        "kernel_size": Shape(list(ks)),
        "stride": s,
        "dilation": dl,
        "padding": p,
    }
    return stage1(op, [x], TensorType(x.dtype, Shape([n, c, *out_hw]), x.device), attrs)
