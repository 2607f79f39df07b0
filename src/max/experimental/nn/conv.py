"""``Conv2d``: 2-D convolution of NHWC input (``max.graph.ops.conv2d``)."""

from __future__ import annotations

import math
from typing import Any

from max.dtype import DType
from max.experimental import random
from max.experimental.nn.module import Module
from max.graph.type import FilterLayout

__all__ = ["Conv2d"]


def _pair(v: Any, name: str) -> tuple[int, int]:
    t = (v, v) if isinstance(v, int) else tuple(v)
    if len(t) != 2 or not all(isinstance(e, int) and not isinstance(e, bool) for e in t):
        raise ValueError(f"Conv2d: {name} must be an int or a pair of ints, got {v!r}")
    return t  # type: ignore[return-value]


class Conv2d(Module):
    """A 2-D convolution over NHWC input ``[N, H, W, in_channels]``.

    The filter is stored ``[kh, kw, in_channels / num_groups, out_channels]`` (MAX's RSCF
    layout), or PyTorch's ``[out_channels, in_channels / num_groups, kh, kw]`` with
    ``permute=True`` (so ``nn.Conv2d`` state dicts load as they are).  ``padding`` is an
    int, a ``(h, w)`` pair or ``(top, bottom, left, right)``.
    """

    def __init__(self, kernel_size: Any, in_channels: int, out_channels: int, *, dtype: DType | None = None,
                 stride: Any = 1, padding: Any = 0, dilation: Any = 1, num_groups: int = 1, device: Any = None,
                 has_bias: bool = False, permute: bool = False) -> None:
        kh, kw = _pair(kernel_size, "kernel_size")
        if in_channels % num_groups or out_channels % num_groups:
            raise ValueError(f"Conv2d: in_channels ({in_channels}) and out_channels ({out_channels}) must be "
                             f"divisible by num_groups ({num_groups})")
        self.stride = _pair(stride, "stride")
        self.dilation = _pair(dilation, "dilation")
        p = (padding,) * 4 if isinstance(padding, int) else tuple(padding)
        if len(p) == 2:
            p = (p[0], p[0], p[1], p[1])
        if len(p) != 4:
            raise ValueError(f"Conv2d: padding must be an int, (h, w) or (top, bottom, left, right), got {padding!r}")
        self.padding = p
        self.num_groups = num_groups
        self.permute = permute
        self.in_channels, self.out_channels = in_channels, out_channels
        cpg = in_channels // num_groups
        shape = [out_channels, cpg, kh, kw] if permute else [kh, kw, cpg, out_channels]
        bound = 1.0 / math.sqrt(cpg * kh * kw)
        self.weight = random.uniform(shape, range=(-bound, bound), dtype=dtype, device=device)
        self.bias: Any = (random.uniform([out_channels], range=(-bound, bound), dtype=dtype, device=device)
                          if has_bias else None)

    def forward(self, x: Any) -> Any:
        from max.experimental import functional as F

        layout = FilterLayout.FCRS if self.permute else FilterLayout.RSCF
        return F.conv2d(x, self.weight, self.stride, self.dilation, self.padding, self.num_groups, self.bias,
                        filter_layout=layout)
