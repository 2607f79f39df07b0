"""Kernels for the engine's fused patterns (see ``engine/compiler/fusion.py``)."""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
import torch.nn.functional as F

from max.engine.kernels import kernel, preparer
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
def fused_rms_norm(x: torch.Tensor, w: torch.Tensor | None = None, eps: float = 1e-6,
                   native: str | None = None) -> torch.Tensor:
    """RMSNorm: on the ``native`` kernel variant (set at lowering) for float32 CPU rows, else torch."""
    if native and x.dtype == torch.float32 and x.device.type == "cpu" and (w is None or w.dtype == torch.float32):
        from max.engine import native as lmx

        x2 = x.reshape(-1, x.shape[-1])
        if x2.stride(-1) == 1 and (w is None or w.is_contiguous()):
            return lmx.rmsnorm(x2, w, eps, so=lmx.library(native)).reshape(x.shape)
    return rms_norm(x, w, eps, multiply_before_cast=True)


@kernel("fused_attention")
def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                    scale: float = 1.0) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


# ------------------------------------------------------------------ projections (linear_fusion.py)
_PLANS: dict[tuple, tuple] = {}


def _plan_for(so: Any, weights: tuple, biases: list, kinds: tuple, ns: tuple, k: int,
              norm: tuple | None = None) -> Any:
    """A native MatmulPlan on library ``so`` for these bound tensors, built once (keyed by the tensors'
    identity)."""
    key = (id(so), *(id(t) for t in weights), *(id(b) if b is not None else 0 for b in biases),
           *((id(norm[0]), norm[1]) if norm is not None else ()))
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
    plan = native.MatmulPlan(list(weights), codes, modes, list(ns), k, biases, so=so, norm=norm)
    refs = tuple(weakref.ref(t) for t in weights)
    if len(_PLANS) > 4096:
        _PLANS.clear()
    _PLANS[key] = (refs, plan)
    return plan


def _layout_ok(x: torch.Tensor, weights: tuple, kinds: tuple) -> bool:
    """Whether the tensors are laid out as the native kernels read them (CPU float32 activations,
    dense weights with unit row stride); which kernel runs was decided at lowering (``native_max_m``)."""
    if x.device.type != "cpu" or x.dtype != torch.float32:
        return False
    return all(kind != "dense" or (w.dim() == 2 and w.device.type == "cpu" and w.stride(1) == 1)
               for kind, w in zip(kinds, weights))


_wide = threading.local()


def _wide_buffer(numel: int) -> torch.Tensor:
    """This thread's reused float32 buffer of at least ``numel`` elements."""
    buf = getattr(_wide, "buf", None)
    if buf is None or buf.numel() < numel:
        buf = _wide.buf = torch.empty(numel, dtype=torch.float32)
    return buf


def _blockwise_linear(x2: torch.Tensor, w: torch.Tensor, kind: str, n: int, k: int, so: Any = None) -> torch.Tensor:
    """``x2 @ W.T`` in torch for a half-precision or packed quantised ``W``: a block of rows at a time is
    widened exactly (dequantised) to float32 into a reused buffer of about 1 MiB, then one GEMM per
    block -- never a float32 copy of the whole weight.  Packed rows are read by library ``so`` (the
    node's variant: packed weights exist only under the native lowering)."""
    from max.engine import native

    rows = max(16, (1 << 18) // k)
    buf = _wide_buffer(min(n, rows) * k)
    code = native.GGML_KINDS[kind[7:]] if kind.startswith("packed:") else None
    out = None if rows >= n else torch.empty((x2.shape[0], n), dtype=torch.float32)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        if code is not None:
            wb = native.packed_rows_f32(w, code, n, k, r0, r1, buf, so=so)
        else:
            wb = buf[: (r1 - r0) * k].view(r1 - r0, k)
            wb.copy_(w[r0:r1])
        if out is None:  # one block: its product is the result
            return x2 @ wb.t()
        out[:, r0:r1] = x2 @ wb.t()
    return out


def _gate(y: torch.Tensor, act: str) -> torch.Tensor:
    n = y.shape[-1] // 2
    g, u = y[..., :n], y[..., n:]
    if act == "silu":
        return F.silu(g) * u
    return F.gelu(g, approximate="tanh" if act == "gelu_tanh" else "none") * u


def _split(operands: tuple, kinds: tuple, has_bias: tuple, norm_eps: float | None) -> tuple:
    """(weights, biases, norm weight) of the operands after ``x`` (a fused residual, if any, is not included)."""
    nw = len(kinds)
    weights = tuple(operands[:nw])
    it = iter(operands[nw:])
    biases = [next(it) if hb else None for hb in has_bias]
    gamma = next(it) if norm_eps is not None else None
    return weights, biases, gamma


def _residual_2d(r: torch.Tensor, m: int, n: int) -> torch.Tensor | None:
    """``r`` as float32 ``[m, n]`` with unit stride in N (a view; None when it is not one)."""
    if r.dtype != torch.float32 or r.device.type != "cpu" or r.numel() != m * n:
        return None
    r2 = r if r.dim() == 2 else r.reshape(m, n)
    return r2 if r2.stride(1) == 1 and (r2.stride(0) == n or m == 1) else None


@kernel("fused_matmul_t")
def fused_matmul_t(x: torch.Tensor, *operands: torch.Tensor, kinds: tuple, ns: tuple, k: int, has_bias: tuple,
                   act: str | None, exact: bool = False, norm_eps: float | None = None,
                   native_max_m: int = 0, residual: bool = False, native: str | None = None) -> torch.Tensor:
    """``concat_i(x' @ W_iᵀ (+ b_i))`` [gated], ``x' = rms_norm(x, gamma, norm_eps)`` when a norm was fused
    (its weight is the operand after the biases).  Below ``native_max_m`` rows (set at lowering by the backend
    policy, ``max.engine.backend``, with the kernel variant ``native``) the native kernels run, quantised
    weights with 8-bit activation
    codes (one scale per 32 values); else torch, quantised weights as float32 activations times the
    dequantised weight (``exact`` forces that).  ``residual`` (the native lowering fused the add that
    followed, packed weights and no gate only): the last operand ``r`` is added, ``r + result``, in the
    native kernels' epilogue or as the separate add did."""
    res = operands[-1] if residual else None
    weights, biases, gamma = _split(operands[:-1] if residual else operands, kinds, has_bias, norm_eps)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    so = None
    if native:
        from max.engine.native import library

        so = library(native)
    if so is not None and not exact and m < native_max_m and _layout_ok(x2, weights, kinds):
        if x2.stride(1) != 1:
            x2 = x2.contiguous()
        norm = (gamma, norm_eps) if gamma is not None else None
        plan = _plan_for(so, weights, biases, kinds, ns, k, norm)
        r2 = None if res is None or act is not None else _residual_2d(res, m, plan.n_out)
        if r2 is not None and all(f is not None for f in plan.res_fns):
            y = plan(x2, residual=r2)
            res = None  # added
        else:
            y = plan(x2)
        if act is not None:
            from max.engine.native import glu

            y = glu(y, 0 if act == "silu" else 1, so=so) if act in ("silu", "gelu_tanh") else _gate(y, act)
    else:
        if gamma is not None:
            x2 = rms_norm(x2, gamma, norm_eps, multiply_before_cast=True)
        cols = []
        for kind, w, b, n in zip(kinds, weights, biases, ns):
            widen = x2.dtype == torch.float32 and x2.device.type == "cpu" and w.device.type == "cpu"
            if kind == "dense" and (w.dtype == x2.dtype or not widen):
                cols.append(F.linear(x2, w if w.dtype == x2.dtype else w.to(x2.dtype), b))
            elif kind == "dense" or kind.startswith("packed:"):  # half or packed weights, float32 on the CPU
                if not widen:
                    raise RuntimeError("fused_matmul_t: packed weights take float32 activations on the CPU")
                yb = _blockwise_linear(x2 if x2.is_contiguous() else x2.contiguous(), w, kind, n, k, so)
                cols.append(yb if b is None else yb.add_(b.to(yb.dtype)))
            else:
                from max.engine.kernels import quantization as q

                yq = q.qmatmul(x2, w, kind, fast=False)
                cols.append(yq if b is None else yq + b.to(yq.dtype))
        y = cols[0] if len(cols) == 1 else torch.cat(cols, dim=-1)
        if act is not None:
            y = _gate(y, act)
    if y.dtype != x.dtype:
        y = y.to(x.dtype)
    y = y.reshape(*lead, y.shape[-1])
    return y if res is None else torch.add(res, y)


@preparer("fused_matmul_t")
def prepare_fused_matmul_t(operands: list, kinds: tuple, ns: tuple, k: int, has_bias: tuple, act: str | None,
                           exact: bool = False, norm_eps: float | None = None, native_max_m: int = 0,
                           residual: bool = False, native: str | None = None) -> Any:
    """With constant weights: the native plan is built once; each call quantises/streams only ``x`` (and reads
    the fused residual, when there is one)."""
    consts = tuple(operands[1:-1] if residual else operands[1:])
    if (not native or operands[0] is not None or any(c is None for c in consts) or exact or native_max_m <= 0
            or (residual and operands[-1] is not None)):
        return None
    weights, biases, gamma = _split(consts, kinds, has_bias, norm_eps)
    probe = torch.empty(1, k, dtype=torch.float32)
    if not _layout_ok(probe, weights, kinds):
        return None
    from max.engine import native as lmx

    so = lmx.library(native)
    plan = _plan_for(so, weights, biases, kinds, ns, k, (gamma, norm_eps) if gamma is not None else None)
    glu_code = {"silu": 0, "gelu_tanh": 1}.get(act) if act else None
    fallback_attrs = dict(kinds=kinds, ns=ns, k=k, has_bias=has_bias, act=act, norm_eps=norm_eps, native=native)
    f32, n_out = torch.float32, plan.n_out
    big = native_max_m
    empty = torch.empty
    half = n_out // 2
    (fn, args, col), = plan.calls if len(plan.calls) == 1 else ((None, None, None),)
    nwp, eps = plan.norm
    # packed weights: one lmx_packed_call with the plan bound (the gate of [gate | up] included)
    bound = lmx.packed_plan(plan, -1 if glu_code is None else glu_code)
    pcall, paddr = so.lmx_packed_call, (bound[1] if bound is not None else 0)

    def run(x: torch.Tensor) -> torch.Tensor:
        x2 = x if x.dim() == 2 else x.reshape(-1, k)
        m = x2.shape[0]
        if x2.dtype is not f32 or not x2.is_cpu or x2.stride(1) != 1 or m >= big:
            return fused_matmul_t(x, *consts, **fallback_attrs)
        if paddr:
            w = n_out if glu_code is None else half
            y = empty(m, w, dtype=f32)
            rc = pcall(paddr, m, x2.data_ptr(), x2.stride(0), y.data_ptr(), w, None, 0)
            if rc:
                raise RuntimeError(f"native matmul failed with code {rc}")
            if act is not None and glu_code is None:
                y = _gate(y, act)
            return y if x.dim() == 2 else y.reshape(*x.shape[:-1], y.shape[-1])
        if fn is None:
            y = plan(x2)
        else:  # one native call: no per-call bookkeeping beyond the pointers
            y = empty(m, n_out, dtype=f32)
            rc = fn(m, k, x2.data_ptr(), x2.stride(0), *args, y.data_ptr(), n_out, 0, nwp, eps)
            if rc:
                raise RuntimeError(f"native matmul failed with code {rc}")
        if glu_code is not None:
            out = empty((m, half), dtype=f32)
            so.lmx_glu(y.data_ptr(), m, half, n_out, glu_code, out.data_ptr(), half)
            y = out
        elif act is not None:
            y = _gate(y, act)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], y.shape[-1])

    run.bound = bound  # type: ignore[attr-defined]  # (the struct lmx_packed_call reads stays alive)
    if not residual:
        return run
    fn_res = pcall if paddr and act is None else None
    empty_like = torch.empty_like

    def run_res(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """``r + x @ W^T``: the residual added in the native kernel's epilogue."""
        x2 = x if x.dim() == 2 else x.reshape(-1, k)
        m = x2.shape[0]
        if (fn_res is None or r.dtype is not f32 or not r.is_cpu or not r.is_contiguous() or r.numel() != m * n_out
                or r.shape[-1] != n_out or x2.dtype is not f32 or not x2.is_cpu or x2.stride(1) != 1 or m >= big):
            return torch.add(r, run(x))  # as the separate add after the unfused projection
        y = empty_like(r)  # contiguous [..., n_out], as the add's result
        rc = fn_res(paddr, m, x2.data_ptr(), x2.stride(0), y.data_ptr(), n_out, r.data_ptr(), n_out)
        if rc:
            raise RuntimeError(f"native matmul failed with code {rc}")
        return y

    run_res.bound = bound  # type: ignore[attr-defined]  # (the struct lmx_packed_call reads stays alive)
    return run_res


@preparer("fused_rms_norm")
def prepare_fused_rms_norm(operands: list, eps: float = 1e-6, native: str | None = None) -> Any:
    if not native or len(operands) != 2 or operands[0] is not None or operands[1] is None:
        return None
    w = operands[1]
    if w.dtype != torch.float32 or not w.is_cpu:
        return None
    from max.engine.native import library

    so = library(native)
    w = w.contiguous()
    wp, f32, empty = w.data_ptr(), torch.float32, torch.empty_like
    k = w.shape[0]

    def run(x: torch.Tensor) -> torch.Tensor:
        if x.dtype is not f32 or not x.is_cpu or x.stride(-1) != 1 or x.shape[-1] != k:
            return fused_rms_norm(x, w, eps, native)
        if not x.is_contiguous():
            x = x.contiguous()
        out = empty(x)
        so.lmx_rmsnorm(x.data_ptr(), x.numel() // k, k, k, wp, eps, out.data_ptr(), k)
        return out

    return run
