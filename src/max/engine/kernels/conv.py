"""Kernels for ``max.graph.ops.conv``: torch convolutions on layout views.

A channels-last input is handed to torch as a permuted (channels-last
strided) view, so oneDNN/cuDNN run their NHWC kernels and the result permutes
back without a copy.  Filters are permuted to torch's ``F C (Q) R S`` order.
Asymmetric padding pads only the excess over the symmetric part explicitly.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from max.engine.kernels import kernel


@lru_cache(maxsize=None)
def _filter_perm(layout: str) -> tuple[int, ...]:
    order = "FCQRS" if len(layout) == 5 else "FCRS"
    return tuple(layout.index(ch) for ch in order)


def _channels_first(x: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "NHWC":
        nd = x.dim() - 2
        return x.permute(0, nd + 1, *range(1, nd + 1))
    return x


def _channels_last(y: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "NHWC":
        nd = y.dim() - 2
        return y.permute(0, *range(2, nd + 2), 1)
    return y


def _split_padding(x: torch.Tensor, padding: tuple, channels_last: bool) -> tuple[torch.Tensor, tuple]:
    """Symmetric padding for torch plus an explicit F.pad of the asymmetric excess.

    A channels-last input is padded before it is viewed as channels-first, so
    the padded copy keeps the channels-last layout torch's fast kernels want.
    """
    nd = len(padding) // 2
    sym = tuple(min(padding[2 * i], padding[2 * i + 1]) for i in range(nd))
    extra = [0, 0] if channels_last else []
    for i in reversed(range(nd)):  # F.pad takes the last dim first
        extra += [padding[2 * i] - sym[i], padding[2 * i + 1] - sym[i]]
    if any(extra):
        x = F.pad(x, extra)
    return x, sym


_CONV = {2: F.conv2d, 3: F.conv3d}


def _conv(x, w, bias, stride, dilation, padding, groups, input_layout, filter_layout):
    x, sym = _split_padding(x, padding, input_layout == "NHWC")
    xc = _channels_first(x, input_layout)
    wc = w.permute(_filter_perm(filter_layout))
    if groups > 1 and groups == xc.shape[1] and input_layout == "NHWC" and xc.dim() == 4:
        # depthwise: a contiguous filter reaches oneDNN's depthwise kernel without a strided reorder
        wc = wc.contiguous()
    y = _CONV[x.dim() - 2](xc, wc, bias, stride, sym, dilation, groups)
    return _channels_last(y, input_layout)


@kernel("conv2d")
def conv2d(x, w, bias=None, *, stride, dilation, padding, groups, input_layout, filter_layout):
    return _conv(x, w, bias, stride, dilation, padding, groups, input_layout, filter_layout)


@kernel("conv3d")
def conv3d(x, w, bias=None, *, stride, dilation, padding, groups, input_layout, filter_layout):
    return _conv(x, w, bias, stride, dilation, padding, groups, input_layout, filter_layout)


@kernel("conv2d_transpose")
def conv2d_transpose(x, w, bias=None, *, stride, dilation, padding, output_paddings, input_layout, filter_layout):
    xc = _channels_first(x, input_layout)
    wc = w.permute(_filter_perm(filter_layout))  # (in, out, kh, kw): torch's transposed-conv order
    before, after = padding[0::2], padding[1::2]
    if before == after and all(op < max(s, d) for op, s, d in zip(output_paddings, stride, dilation)):
        y = F.conv_transpose2d(xc, wc, bias, stride, before, output_paddings, 1, dilation)
        return _channels_last(y, input_layout)
    # General case: the full result, cropped by (before, after) and extended by output_paddings.
    y = F.conv_transpose2d(xc, wc, None, stride, 0, 0, 1, dilation)
    index = [slice(None), slice(None)]
    grow = []
    for i in range(2):
        full = y.shape[2 + i]
        end = full - after[i] + output_paddings[i]
        index.append(slice(before[i], min(end, full)))
        grow.append(max(0, end - full))
    y = y[tuple(index)]
    if any(grow):
        y = F.pad(y, (0, grow[1], 0, grow[0]))
    if bias is not None:
        y = y + bias.view(1, -1, 1, 1)
    return _channels_last(y, input_layout)


@kernel("fold")
def fold(x, *, output_size, kernel_size, stride, dilation, padding):
    length = x.shape[2]
    kernel_size = tuple(int(k) for k in kernel_size)
    if kernel_size[0] < 1 or kernel_size[1] < 1 or x.shape[1] % (kernel_size[0] * kernel_size[1]):
        raise ValueError(
            f"fold: input dim 1 ({x.shape[1]}) must be a positive multiple of the kernel size product "
            f"{kernel_size[0]} * {kernel_size[1]}"
        )
    blocks = 1
    for i in range(2):
        blocks *= (output_size[i] + 2 * padding[i] - dilation[i] * (kernel_size[i] - 1) - 1) // stride[i] + 1
    if blocks != length:
        raise ValueError(
            f"fold: input has L={length} blocks but output_size {tuple(output_size)} gives {blocks}"
        )
    return F.fold(x, tuple(output_size), kernel_size, dilation, padding, stride)
