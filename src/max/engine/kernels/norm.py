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


_HALF = (torch.float16, torch.bfloat16)


@kernel("rms_norm")
def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, epsilon: float = 1e-6,
             weight_offset: float = 0.0, multiply_before_cast: bool = False) -> torch.Tensor:
    """RMS norm over the last dim (float32 math for half inputs)."""
    w = None if weight is None else (weight + weight_offset if weight_offset else weight)
    if x.dtype in _HALF:
        y = F.rms_norm(x.float(), (x.shape[-1],), None, epsilon)
        if w is None:
            return y.to(x.dtype)
        if multiply_before_cast:
            return (y * w.float()).to(x.dtype)
        return y.to(x.dtype) * w
    return F.rms_norm(x, (x.shape[-1],), w, epsilon)


@kernel("group_norm")
def group_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, num_groups: int,
               epsilon: float) -> torch.Tensor:
    # computed directly: F.group_norm refuses groups of one value (a valid, all-zero normalisation)
    work = torch.float32 if x.dtype in _HALF else x.dtype
    n, c = x.shape[0], x.shape[1]
    g = x.to(work).reshape(n, num_groups, -1)
    var, mean = torch.var_mean(g, dim=-1, keepdim=True, correction=0)
    y = ((g - mean) * torch.rsqrt(var + epsilon)).reshape(x.shape)
    affine = (c,) + (1,) * (x.dim() - 2)
    return (y * gamma.to(work).reshape(affine) + beta.to(work).reshape(affine)).to(x.dtype)
