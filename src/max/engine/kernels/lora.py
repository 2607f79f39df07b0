"""Kernel for ``max.nn.lora``: the per-token low-rank update of LoRA projections."""

from __future__ import annotations

import torch

from max.engine.kernels import kernel


@kernel("lora_delta_add")
def lora_delta_add(y: torch.Tensor, x: torch.Tensor, mask: torch.Tensor, a: torch.Tensor,
                   b: torch.Tensor) -> torch.Tensor:
    """``y + ((x @ a) * mask) @ b``; ``y`` itself when no row of ``mask`` selects an adapter (the update
    would be exactly zero), so adapter-free steps of a LoRA-enabled model skip both matmuls."""
    if not bool(mask.any()):
        return y
    low = (x.to(a.dtype) @ a) * mask
    return y + (low @ b).to(y.dtype)


@kernel("lora_group_mask")
def lora_group_mask(offsets: torch.Tensor, ids: torch.Tensor, ranks: torch.Tensor, rows_of: torch.Tensor,
                    max_rank: int, num_loras: int, dtype: torch.dtype) -> torch.Tensor:
    rows = rows_of.shape[0]
    dev = offsets.device
    offs = offsets.to(torch.int64)
    g = torch.searchsorted(offs[1:], torch.arange(rows, device=dev), right=True)  # group of each row
    in_group = g < ids.shape[0]
    gi = g.clamp(max=max(ids.shape[0] - 1, 0))
    slot = torch.where(in_group, ids.to(torch.int64)[gi], -1) if ids.numel() else torch.full_like(g, -1)
    rank = torch.where(in_group, ranks.to(torch.int64)[gi], 0) if ids.numel() else torch.zeros_like(g)
    col = torch.arange(num_loras * max_rank, device=dev)[None, :]
    hit = (slot[:, None] >= 0) & (col // max_rank == slot[:, None]) & (col % max_rank < rank[:, None])
    return hit.to(dtype)
