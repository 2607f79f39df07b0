"""Kernels for the engine's fused patterns (see ``engine/compiler/fusion.py``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from max.engine.kernels import kernel
from max.engine.kernels.norm import rms_norm
from max.engine.kernels.linalg import half_matmul

_ACT = {
    "relu": lambda t, a: F.relu(t, inplace=True),
    "silu": lambda t, a: F.silu(t, inplace=True),
    "gelu": lambda t, a: (t * torch.sigmoid(1.702 * t)) if a == "quick" else F.gelu(t, approximate=a),
    "sigmoid": lambda t, a: torch.sigmoid_(t),
    "tanh": lambda t, a: torch.tanh_(t),
}


def _mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return half_matmul(x, w) if x.dtype in (torch.bfloat16, torch.float16) else torch.matmul(x, w)


@kernel("fused_linear")
def fused_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, act: str | None = None,
                 approximate: str = "none") -> torch.Tensor:
    if x.dim() == 2 and x.dtype not in (torch.bfloat16, torch.float16):
        y = torch.addmm(b, x, w)
    else:
        y = _mm(x, w).add_(b)
    return y if act is None else _ACT[act](y, approximate)


@kernel("fused_swiglu")
def fused_swiglu(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
    return F.silu(_mm(x, w1), inplace=True).mul_(_mm(x, w3))


@kernel("fused_rms_norm")
def fused_rms_norm(x: torch.Tensor, w: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    return rms_norm(x, w, eps, multiply_before_cast=True)


@kernel("fused_attention")
def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                    scale: float = 1.0) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
