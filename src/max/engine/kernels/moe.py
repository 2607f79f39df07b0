"""Kernels for ``max.nn.moe``: expert routing and the routed experts as grouped matmuls.

``moe_experts_ffn`` over a few tokens (decode batches: at most ``NATIVE_MAX_PAIRS`` token/expert pairs)
runs as one native call (``csrc/moe.c``: pairs grouped by expert in C, each expert's weight rows read once
for its pairs, no host-side sort, gather or scatter-add) when the operands are float32 CPU tensors; longer
batches (prefill) group the pairs and run one torch matmul per active expert."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from max.engine.kernels import kernel
from max.engine.kernels.linalg import half_matmul


@kernel("moe_route")
def moe_route(logits: torch.Tensor, k: int, routing: str, renormalize: bool, scaling: float, n_group: int,
              topk_group: int) -> tuple:
    lg = logits.float()
    if routing == "topk_softmax":
        vals, ids = torch.topk(lg, k, dim=-1)
        w = torch.softmax(vals, dim=-1)
    else:
        scores = torch.softmax(lg, dim=-1)
        sel = scores
        if n_group > 1:  # keep the experts of the topk_group groups with the best single expert
            T, E = scores.shape
            best = scores.view(T, n_group, E // n_group).max(dim=-1).values
            keep = torch.zeros_like(best).scatter_(1, torch.topk(best, topk_group, dim=-1).indices, 1.0)
            sel = scores.masked_fill(~keep.bool().repeat_interleave(E // n_group, dim=1), 0.0)
        w, ids = torch.topk(sel, k, dim=-1)
        if renormalize:
            w = w / w.sum(dim=-1, keepdim=True)
    if scaling != 1.0:
        w = w * scaling
    return ids, w


def _act(g: torch.Tensor, u: torch.Tensor, activation: str, alpha: float, limit: float) -> torch.Tensor:
    if activation == "silu":
        return F.silu(g) * u
    if activation == "gelu_tanh":
        return F.gelu(g, approximate="tanh") * u
    if activation == "gelu":
        return F.gelu(g) * u
    g = g.clamp(max=limit)
    u = u.clamp(min=-limit, max=limit)
    return (u + 1) * (g * torch.sigmoid(g * alpha))


def create_indices(topk_ids: torch.Tensor, num_experts: int) -> tuple:
    """Group the ``(token, slot)`` pairs of ``topk_ids`` ``[T, k]`` by expert (``moe_create_indices``).

    Returns ``token_expert_order`` (uint32 ``[T*k]``: flat pair indices sorted by expert, stable),
    ``expert_start_indices`` (uint32 ``[num_experts + 1]``: where the i-th *active* expert's rows start
    in that order; entries past the last active expert hold ``T*k``), ``restore_token_order`` (uint32
    ``[T*k]``: the inverse permutation), ``expert_ids`` (int32 ``[num_experts]``: the active experts in
    order, then -1) and ``expert_usage_stats`` (uint32 ``[2]``: most rows of one expert, active experts).
    """
    flat = topk_ids.reshape(-1).to(torch.int64)
    n = flat.numel()
    dev = flat.device
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)[:num_experts]
    active = torch.nonzero(counts > 0).reshape(-1)
    n_active = active.numel()
    starts = torch.full((num_experts + 1,), n, dtype=torch.int64, device=dev)
    starts[0] = 0
    starts[1:n_active + 1] = torch.cumsum(counts[active], 0)
    ids = torch.full((num_experts,), -1, dtype=torch.int64, device=dev)
    ids[:n_active] = active
    restore = torch.empty_like(order)
    restore[order] = torch.arange(n, device=dev)
    stats = torch.tensor([int(counts.max()) if n else 0, n_active], dtype=torch.int64, device=dev)
    u32 = torch.uint32
    return order.to(u32), starts.to(u32), restore.to(u32), ids.to(torch.int32), stats.to(u32)


def grouped_matmul(x: torch.Tensor, weight: torch.Tensor, starts: torch.Tensor, expert_ids: torch.Tensor,
                   n_active: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Rows ``starts[i] .. starts[i + 1]`` of ``x`` times ``weight[expert_ids[i]].T`` (+ ``bias[expert]``), for
    each of the ``n_active`` groups (``grouped_matmul_ragged``); rows outside every group are zero."""
    mm = half_matmul if x.dtype in (torch.bfloat16, torch.float16) else torch.matmul
    out = x.new_zeros(x.shape[0], weight.shape[1])
    st = starts.to(torch.int64).tolist()
    ids = expert_ids.to(torch.int64).tolist()
    for i in range(n_active):  # one matmul per expert that has rows
        a, b = st[i], st[i + 1]
        if b <= a:
            continue
        y = mm(x[a:b], weight[ids[i]].T)
        out[a:b] = y + bias[ids[i]] if bias is not None else y
    return out


@kernel("moe_create_indices")
def moe_create_indices(topk_ids: torch.Tensor, num_experts: int) -> tuple:
    return create_indices(topk_ids, num_experts)


@kernel("grouped_matmul_ragged")
def grouped_matmul_ragged(x: torch.Tensor, weight: torch.Tensor, starts: torch.Tensor, expert_ids: torch.Tensor,
                          usage_stats: torch.Tensor) -> torch.Tensor:
    n_active = int(usage_stats.reshape(-1)[1])
    return grouped_matmul(x, weight, starts, expert_ids, n_active)


NATIVE_MAX_PAIRS = 64
"""Most token/expert pairs ``moe_experts_ffn`` runs through the native kernel (beyond: grouped matmuls)."""

_ACT_CODE = {"silu": 0, "gelu_tanh": 1, "gelu": 2, "swigluoai": 3}


def _native_ffn(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                down: torch.Tensor, gb: torch.Tensor | None, ub: torch.Tensor | None, db: torch.Tensor | None,
                activation: str, alpha: float, limit: float, native: str) -> torch.Tensor | None:
    """``moe_experts_ffn`` through ``lmx_moe_ffn`` of kernel variant ``native``, or None when it cannot run
    there."""
    ts = [t for t in (x, weights, gate, up, down, gb, ub, db) if t is not None]
    if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in ts):
        return None
    from max.engine.native import library

    so = library(native)
    T, H = x.shape
    E, I, _ = gate.shape
    k = ids.shape[1]

    def c(t: torch.Tensor | None) -> torch.Tensor | None:
        return t if t is None or t.is_contiguous() else t.contiguous()

    x = x if x.stride(1) == 1 else x.contiguous()
    ids = ids.to(torch.int64).contiguous()
    weights, gate, up, down, gb, ub, db = (c(t) for t in (weights, gate, up, down, gb, ub, db))
    ws = torch.empty(T * k * (2 * H + 3 * I), dtype=torch.float32)
    out = torch.empty(T, H, dtype=torch.float32)

    def ptr(t: torch.Tensor | None) -> int | None:
        return None if t is None else t.data_ptr()

    rc = so.lmx_moe_ffn(T, H, I, k, E, x.data_ptr(), x.stride(0), ids.data_ptr(), weights.data_ptr(),
                        gate.data_ptr(), up.data_ptr(), down.data_ptr(), ptr(gb), ptr(ub), ptr(db),
                        _ACT_CODE[activation], alpha, limit, ws.data_ptr(), out.data_ptr())
    if rc == 1:
        raise ValueError(f"moe_experts_ffn: an expert id is outside [0, {E})")
    if rc:
        raise RuntimeError(f"moe_experts_ffn: native kernel failed with code {rc}")
    return out


@kernel("moe_experts_ffn")
def moe_experts_ffn(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                    down: torch.Tensor, *rest: torch.Tensor, activation: str, alpha: float, limit: float,
                    biases: tuple, native: str | None = None) -> torch.Tensor:
    """The routed experts as ``moe_create_indices`` + three ``grouped_matmul_ragged`` (gate, up, down); up to
    :data:`NATIVE_MAX_PAIRS` token/expert pairs one call of the ``native`` kernel variant (set at lowering)."""
    it = iter(rest)
    gb, ub, db = (next(it) if present else None for present in biases)
    k = ids.shape[1]
    if native and ids.numel() <= NATIVE_MAX_PAIRS:
        out = _native_ffn(x, ids, weights, gate, up, down, gb, ub, db, activation, alpha, limit, native)
        if out is not None:
            return out
    order, starts, _, eids, stats = create_indices(ids, gate.shape[0])
    order = order.to(torch.int64)
    n_active = int(stats[1])
    tok = order // k  # token of each sorted (token, expert) pair
    xs = x[tok]
    g = grouped_matmul(xs, gate, starts, eids, n_active, gb)
    u = grouped_matmul(xs, up, starts, eids, n_active, ub)
    y = grouped_matmul(_act(g, u, activation, alpha, limit), down, starts, eids, n_active, db)
    out = torch.zeros_like(x)
    out.index_add_(0, tok, y * weights.reshape(-1)[order].to(x.dtype)[:, None])
    return out
