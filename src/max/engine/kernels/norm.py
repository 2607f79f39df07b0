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


@kernel("gated_rms_norm")
def gated_rms_norm(x: torch.Tensor, weight: torch.Tensor, *gate: torch.Tensor, epsilon: float, num_groups: int,
                   norm_before_gate: bool, has_gate: bool, native: str | None = None) -> torch.Tensor:
    """On CPU tensors one pass per row of the ``native`` kernel variant (set at lowering;
    ``lmx_gated_rmsnorm``), else torch."""
    z = gate[0] if has_gate else None
    D = x.shape[-1]
    if native and x.device.type == "cpu" and x.numel():
        from max.engine.native import library

        so = library(native)
        x2 = x.reshape(-1, D)
        z2 = None if z is None else z.reshape(-1, D)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        if z2 is not None and z2.stride(-1) != 1:
            z2 = z2.contiguous()
        w = weight.contiguous()
        out = torch.empty(x2.shape, dtype=torch.float32)
        so.lmx_gated_rmsnorm(x2.data_ptr(), x2.shape[0], D, x2.stride(0), 0 if z2 is None else z2.data_ptr(),
                             0 if z2 is None else z2.stride(0), w.data_ptr(), num_groups, epsilon,
                             int(norm_before_gate), out.data_ptr())
        return out.reshape(x.shape)
    g = F.silu(z) if z is not None else None
    h = x * g if g is not None and not norm_before_gate else x
    hg = h.reshape(*h.shape[:-1], num_groups, D // num_groups)
    y = (hg * torch.rsqrt((hg * hg).mean(-1, keepdim=True) + epsilon)).reshape(x.shape) * weight
    return y * g if g is not None and norm_before_gate else y
