"""Kernels for ``max.graph.ops.norm`` (operands arrive with equal dtypes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from max.engine.kernels import kernel


@kernel("layer_norm")
def layer_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, epsilon: float) -> torch.Tensor:
    shape = (x.shape[-1],)
    if x.dtype in (torch.float16, torch.bfloat16) and x.device.type == "cpu":
        return F.layer_norm(x.float(), shape, gamma.float(), beta.float(), epsilon).to(x.dtype)
    return F.layer_norm(x, shape, gamma, beta, epsilon)
