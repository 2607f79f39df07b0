"""Kernels for ``max.graph.ops.buffer``: they mutate the caller's buffer in place."""

from __future__ import annotations

import torch

from max.engine.kernels import kernel
from max.engine.kernels.indexing import substitute_index


@kernel("buffer_create", pure=False)
def buffer_create(*, shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype, device=device)


@kernel("buffer_load", pure=False)
def buffer_load(buf: torch.Tensor) -> torch.Tensor:
    return buf.clone()


@kernel("buffer_store", pure=False)
def buffer_store(buf: torch.Tensor, src: torch.Tensor) -> None:
    buf.copy_(src)


@kernel("buffer_store_slice", pure=False)
def buffer_store_slice(buf: torch.Tensor, src: torch.Tensor, *ts: torch.Tensor, index: tuple, subs: tuple = (),
                       adv_ints: tuple = ()) -> None:
    idx = substitute_index(index, subs, ts, adv_ints, buf.device)
    buf[idx] = src
