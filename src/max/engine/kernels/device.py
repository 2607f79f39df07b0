"""Kernels for ``max.graph.ops.device``."""

from __future__ import annotations

import torch

from max.engine.kernels import kernel


@kernel("transfer_to", foldable=False)
def transfer_to(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    return x.to(device)
