"""Kernels for the engine's fused patterns (see ``engine/compiler/fusion.py``)."""

from __future__ import annotations

import weakref
from typing import Any

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
    if x.dtype == torch.float32 and x.device.type == "cpu" and (w is None or w.dtype == torch.float32):
        from max.engine import native

        if native.lib() is not None:
            x2 = x.reshape(-1, x.shape[-1])
            if x2.stride(-1) == 1 and (w is None or w.is_contiguous()):
                return native.rmsnorm(x2, w, eps).reshape(x.shape)
    return rms_norm(x, w, eps, multiply_before_cast=True)


@kernel("fused_attention")
def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                    scale: float = 1.0) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


# ------------------------------------------------------------------ projections (linear_fusion.py)
_PLANS: dict[tuple, tuple] = {}


def _plan_for(weights: tuple, biases: list, kinds: tuple, ns: tuple, k: int) -> Any:
    """A native MatmulPlan for these bound tensors, built once (keyed by the tensors' identity)."""
    key = tuple(id(t) for t in weights) + tuple(id(b) if b is not None else 0 for b in biases)
    hit = _PLANS.get(key)
    if hit is not None and all(r() is t for r, t in zip(hit[0], weights)):
        return hit[1]
    from max.engine import native

    codes, modes = [], []
    for kind, w in zip(kinds, weights):
        if kind == "dense":
            codes.append(native.dense_kind(w.dtype))
            modes.append("dense")
        elif kind.startswith("packed:"):
            codes.append(native.GGML_KINDS[kind[7:]])
            modes.append("packed")
        else:
            codes.append(native.GGML_KINDS[kind])
            modes.append("ggml")
    plan = native.MatmulPlan(list(weights), codes, modes, list(ns), k, biases)
    refs = tuple(weakref.ref(t) for t in weights)
    if len(_PLANS) > 4096:
        _PLANS.clear()
    _PLANS[key] = (refs, plan)
    return plan


def _native_ok(x: torch.Tensor, weights: tuple, kinds: tuple) -> bool:
    from max.engine import native

    if x.device.type != "cpu" or x.dtype != torch.float32 or native.lib() is None:
        return False
    for kind, w in zip(kinds, weights):
        if kind == "dense":
            if native.dense_kind(w.dtype) is None or w.dim() != 2 or w.device.type != "cpu" or w.stride(1) != 1:
                return False
        elif not kind.startswith("packed:") and kind not in native.GGML_KINDS:
            return False
    return True


# Dense float32 projections at or above this many rows go to torch's BLAS GEMM (faster there);
# below it the native kernel streams the weight once (decode).
DENSE_NATIVE_MAX_M = 32


def _gate(y: torch.Tensor, act: str) -> torch.Tensor:
    n = y.shape[-1] // 2
    g, u = y[..., :n], y[..., n:]
    if act == "silu":
        return F.silu(g) * u
    return F.gelu(g, approximate="tanh" if act == "gelu_tanh" else "none") * u


@kernel("fused_matmul_t")
def fused_matmul_t(x: torch.Tensor, *operands: torch.Tensor, kinds: tuple, ns: tuple, k: int, has_bias: tuple,
                   act: str | None, exact: bool = False) -> torch.Tensor:
    """``concat_i(x @ W_iᵀ (+ b_i))`` [gated].  Quantised weights run on the native kernels with 8-bit
    activation codes (one scale per 32 values) unless ``exact``: then float32 activations times the
    dequantised weight."""
    nw = len(kinds)
    weights = operands[:nw]
    it = iter(operands[nw:])
    biases = [next(it) if hb else None for hb in has_bias]
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    dense_big = m >= DENSE_NATIVE_MAX_M and all(kd == "dense" and w.dtype == torch.float32
                                                 for kd, w in zip(kinds, weights))
    if not dense_big and not exact and _native_ok(x2, weights, kinds):
        if x2.stride(1) != 1:
            x2 = x2.contiguous()
        y = _plan_for(weights, biases, kinds, ns, k)(x2)
        if act is not None:
            from max.engine import native

            y = native.glu(y, 0 if act == "silu" else 1) if act in ("silu", "gelu_tanh") else _gate(y, act)
    else:
        cols = []
        for kind, w, b in zip(kinds, weights, biases):
            if kind == "dense":
                wt = w if w.dtype == x2.dtype else w.to(x2.dtype)
                cols.append(F.linear(x2, wt, b))
            else:
                if kind.startswith("packed:"):
                    raise RuntimeError("fused_matmul_t: packed weights need the native kernels")
                from max.engine.kernels import quantization as q

                yq = q.qmatmul(x2, w, kind, fast=False)
                cols.append(yq if b is None else yq + b.to(yq.dtype))
        y = cols[0] if len(cols) == 1 else torch.cat(cols, dim=-1)
        if act is not None:
            y = _gate(y, act)
    if y.dtype != x.dtype:
        y = y.to(x.dtype)
    return y.reshape(*lead, y.shape[-1])
