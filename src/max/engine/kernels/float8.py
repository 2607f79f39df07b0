"""Kernels for ``max.nn.kernels``' float8 entry points (``max.nn.kernels_float8``).

Float8 tensors are torch float8 tensors; quantisation saturates to the format's largest finite
value before the (round-to-nearest-even) conversion, so nothing overflows to NaN."""

from __future__ import annotations

import torch

from max.engine.kernels import kernel


def _saturate(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    m = torch.finfo(dtype).max
    return x.clamp(-m, m).to(dtype)


@kernel("quantize_static_scaled_float8")
def quantize_static_scaled_float8(x: torch.Tensor, scale: torch.Tensor, inverted: bool,
                                  out_dtype: torch.dtype) -> torch.Tensor:
    xf, s = x.float(), scale.float()
    return _saturate(xf * s if inverted else xf / s, out_dtype)


@kernel("quantize_dynamic_scaled_float8")
def quantize_dynamic_scaled_float8(x: torch.Tensor, group: int, scale_ub: float, q_dtype: torch.dtype,
                                   s_dtype: torch.dtype) -> tuple:
    M, K = x.shape
    g = K if group == -1 else group
    xf = x.float().reshape(M, K // g, g)
    scales = (xf.abs().amax(dim=-1).clamp(max=scale_ub) / torch.finfo(q_dtype).max).to(s_dtype)
    s = scales.float()[..., None]
    q = _saturate(torch.where(s > 0, xf / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(xf)), q_dtype)
    return q.reshape(M, K), scales


def _scaled_mm(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
               out_dtype: torch.dtype) -> torch.Tensor:
    return ((a.float() @ b.float().T) * sa.float() * sb.float()).to(out_dtype)


@kernel("matmul_static_scaled_float8")
def matmul_static_scaled_float8(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
                                out_dtype: torch.dtype) -> torch.Tensor:
    return _scaled_mm(a, b, sa, sb, out_dtype)


@kernel("dynamic_scaled_matmul")
def dynamic_scaled_matmul(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
                          out_dtype: torch.dtype) -> torch.Tensor:
    return _scaled_mm(a, b, sa, sb, out_dtype)


@kernel("normalize_e4m3fn_to_e4m3fnuz")
def normalize_e4m3fn_to_e4m3fnuz(w: torch.Tensor) -> torch.Tensor:
    bits = w.view(torch.uint8)
    bits = torch.where(bits == 0x80, torch.zeros_like(bits), bits)
    return bits.view(torch.float8_e4m3fnuz)


@kernel("matmul_float8_weight")
def matmul_float8_weight(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, block: tuple) -> torch.Tensor:
    bo, bi = block
    N, K = w.shape
    scale = s.float().repeat_interleave(bo, dim=0).repeat_interleave(bi, dim=1)[:N, :K]
    wf = w.float() * scale  # transient: the float8 weight is what stays in memory
    return (x.float() @ wf.T).to(x.dtype)
