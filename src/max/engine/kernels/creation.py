"""Kernels for ``max.graph.ops.creation``."""

from __future__ import annotations

import math

import torch

from max.engine.kernels import kernel


@kernel("range")
def range_(*ts: torch.Tensor, start, stop, step, dtype: torch.dtype, device: torch.device,
           length: int | None = None) -> torch.Tensor:
    vals = [start, stop, step]
    if ts:
        it = iter(ts)
        vals = [next(it).item() if v is None else v for v in vals]
    wide = torch.float64 if any(isinstance(v, float) for v in vals) else torch.int64
    if length is not None:
        # the type rule's length (MAX's floored (stop - start) // step): start + step * i
        i = torch.arange(length, dtype=wide, device=device)
        return (vals[0] + vals[2] * i).to(dtype)
    return torch.arange(vals[0], vals[1], vals[2], dtype=wide, device=device).to(dtype)


@kernel("hann_window")
def hann_window(window_length: int, periodic: bool, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    n = torch.arange(window_length, dtype=torch.float64, device=device)
    denom = window_length if periodic else window_length - 1
    if denom <= 0:
        return torch.ones(window_length, dtype=dtype, device=device)
    return (0.5 - 0.5 * torch.cos(n * (2 * math.pi / denom))).to(dtype)
