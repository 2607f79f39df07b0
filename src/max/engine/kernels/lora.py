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
