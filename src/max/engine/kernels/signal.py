"""Kernels for ``max.graph.ops.signal``: ``irfft`` (torch.fft), ``nonzero``, ``masked_scatter``."""

from __future__ import annotations

import torch

from max.engine.kernels import kernel

_WIDE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


@kernel("irfft")
def irfft(x, *, n, axis, norm, input_is_complex):
    dt = x.dtype
    xw = x.to(_WIDE.get(dt, dt))
    if input_is_complex:
        xw = torch.view_as_complex(xw.contiguous())
    return torch.fft.irfft(xw, n=n, dim=axis, norm=norm).to(dt)


@kernel("nonzero")
def nonzero(x, *, count):
    idx = torch.nonzero(x)
    if count is not None and idx.shape[0] != count:
        raise ValueError(f"nonzero: x has {idx.shape[0]} non-zero elements but out_dim is {count}")
    return idx


@kernel("masked_scatter")
def masked_scatter(x, mask, updates, *, shape, count):
    shape = tuple(shape)
    x = x.expand(shape)
    mask = mask.expand(shape)
    if count is not None:
        got = int(mask.sum())
        if got != count:
            raise ValueError(f"masked_scatter: mask has {got} true elements but out_dim is {count}")
    return x.masked_scatter(mask, updates.reshape(-1))
