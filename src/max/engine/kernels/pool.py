"""Kernels for ``max.graph.ops.pool``.

NHWC pooling runs torch's pooling on a channels-last view (no copies).  The
cases torch's pooling does not take (padding above half the kernel, dilated
average pooling) pad explicitly and slice to the size the type rule computed,
which selects exactly the same windows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from max.engine.kernels import kernel


def _nchw(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 3, 1, 2)


def _nhwc(y: torch.Tensor) -> torch.Tensor:
    return y.permute(0, 2, 3, 1)


def _extra(size: int, out: int, k: int, s: int, d: int, p: int) -> int:
    """Right padding beyond ``p`` so that floor-mode pooling yields at least ``out`` windows."""
    return max(0, (out - 1) * s + d * (k - 1) + 1 - (size + 2 * p))


@kernel("max_pool2d")
def max_pool2d(x, *, kernel_size, stride, dilation, padding, ceil_mode, out_hw):
    xc = _nchw(x)
    if padding[0] <= kernel_size[0] // 2 and padding[1] <= kernel_size[1] // 2:
        return _nhwc(F.max_pool2d(xc, kernel_size, stride, padding, dilation, ceil_mode))
    h, w = xc.shape[2:]
    eh = _extra(h, out_hw[0], kernel_size[0], stride[0], dilation[0], padding[0])
    ew = _extra(w, out_hw[1], kernel_size[1], stride[1], dilation[1], padding[1])
    xp = F.pad(xc, (padding[1], padding[1] + ew, padding[0], padding[0] + eh), value=float("-inf"))
    y = F.max_pool2d(xp, kernel_size, stride, 0, dilation, False)
    return _nhwc(y[:, :, : out_hw[0], : out_hw[1]])


@kernel("avg_pool2d")
def avg_pool2d(x, *, kernel_size, stride, dilation, padding, ceil_mode, count_boundary, out_hw):
    xc = _nchw(x)
    if dilation == (1, 1) and padding[0] <= kernel_size[0] // 2 and padding[1] <= kernel_size[1] // 2:
        return _nhwc(F.avg_pool2d(xc, kernel_size, stride, padding, ceil_mode, count_boundary))
    # Window sums by a depthwise all-ones convolution, divided by per-window counts.
    n, c, h, w = xc.shape
    kh, kw = kernel_size
    eh = _extra(h, out_hw[0], kh, stride[0], dilation[0], padding[0])
    ew = _extra(w, out_hw[1], kw, stride[1], dilation[1], padding[1])
    pads = (padding[1], padding[1] + ew, padding[0], padding[0] + eh)
    ones = torch.ones((c, 1, kh, kw), dtype=x.dtype, device=x.device)
    sums = F.conv2d(F.pad(xc, pads), ones, None, stride, 0, dilation, c)[:, :, : out_hw[0], : out_hw[1]]
    hp, wp = h + 2 * padding[0] + eh, w + 2 * padding[1] + ew
    mask = torch.zeros((1, 1, hp, wp), dtype=x.dtype, device=x.device)
    if count_boundary:
        mask[:, :, : h + 2 * padding[0], : w + 2 * padding[1]] = 1
    else:
        mask[:, :, padding[0] : padding[0] + h, padding[1] : padding[1] + w] = 1
    counts = F.conv2d(mask, ones[:1], None, stride, 0, dilation)[:, :, : out_hw[0], : out_hw[1]]
    return _nhwc(sums / counts.clamp_min(1))


@kernel("resize")
def resize(x, *, size, mode):
    if mode == "nearest":
        return F.interpolate(x, size=tuple(size), mode="nearest")
    return F.interpolate(x, size=tuple(size), mode=mode, align_corners=False)


def _source_coords(n_in: int, n_out: int, mode: str, device: torch.device) -> torch.Tensor:
    """Input coordinate (float64) of each output position along one axis."""
    o = torch.arange(n_out, dtype=torch.float64, device=device)
    scale = n_out / n_in
    if mode == "align_corners":
        return o * ((n_in - 1) / (n_out - 1)) if n_out > 1 else torch.zeros_like(o)
    if mode == "asymmetric":
        return o / scale
    x = (o + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel" and n_out == 1:
        return torch.zeros_like(o)
    return x


def _linear_weights(n_in: int, n_out: int, mode: str, antialias: bool, device: torch.device) -> torch.Tensor:
    """``[n_out, n_in]`` interpolation matrix: a tent filter around each source coordinate,
    widened by ``1 / scale`` when antialiasing a downsampled axis, rows normalised (which
    clamps coordinates outside the input to the edge sample)."""
    x = _source_coords(n_in, n_out, mode, device)
    if antialias and n_out < n_in:
        support = n_in / n_out
    else:
        support = 1.0
        x = x.clamp(0, n_in - 1)
    j = torch.arange(n_in, dtype=torch.float64, device=device)
    w = (1.0 - ((j[None, :] - x[:, None]) / support).abs()).clamp_min(0.0)
    return w / w.sum(dim=1, keepdim=True)


def _along(x: torch.Tensor, axis: int, w: torch.Tensor) -> torch.Tensor:
    return torch.movedim(torch.tensordot(x, w.to(x.dtype), dims=([axis], [1])), -1, axis)


@kernel("resize_linear")
def resize_linear(x: torch.Tensor, *, size: tuple, coordinate_transformation_mode: str,
                  antialias: bool) -> torch.Tensor:
    out_dtype = x.dtype
    y = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    for axis, (n_in, n_out) in enumerate(zip(x.shape, size)):
        if n_in != n_out:
            y = _along(y, axis, _linear_weights(n_in, n_out, coordinate_transformation_mode, antialias, x.device))
    return y.to(out_dtype)


_ROUND = {
    "half_down": lambda v: torch.ceil(v - 0.5),
    "half_up": lambda v: torch.floor(v + 0.5),
    "floor": torch.floor,
    "ceil": torch.ceil,
}


@kernel("resize_nearest")
def resize_nearest(x: torch.Tensor, *, size: tuple, coordinate_transformation_mode: str,
                   round_mode: str) -> torch.Tensor:
    for axis, (n_in, n_out) in enumerate(zip(x.shape, size)):
        if n_in != n_out:
            src = _ROUND[round_mode](_source_coords(n_in, n_out, coordinate_transformation_mode, x.device))
            x = x.index_select(axis, src.clamp(0, n_in - 1).to(torch.int64))
    return x
