"""Kernels for ``max.nn.moe``: expert routing and the routed experts as grouped matmuls."""

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


@kernel("moe_experts_ffn")
def moe_experts_ffn(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                     down: torch.Tensor, *rest: torch.Tensor, activation: str, alpha: float, limit: float,
                     biases: tuple) -> torch.Tensor:
    it = iter(rest)
    gb, ub, db = (next(it) if present else None for present in biases)
    T, k = ids.shape
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    tok = order // k  # token of each sorted (token, expert) pair
    counts = torch.bincount(flat, minlength=gate.shape[0]).tolist()
    w_sorted = weights.reshape(-1)[order].to(x.dtype)
    out = torch.zeros_like(x)
    mm = half_matmul if x.dtype in (torch.bfloat16, torch.float16) else torch.matmul
    start = 0
    for e, n in enumerate(counts):  # one grouped matmul per expert that has tokens
        if n == 0:
            continue
        rows = tok[start:start + n]
        xs = x[rows]
        g = mm(xs, gate[e].T)
        u = mm(xs, up[e].T)
        if gb is not None:
            g = g + gb[e]
        if ub is not None:
            u = u + ub[e]
        y = mm(_act(g, u, activation, alpha, limit), down[e].T)
        if db is not None:
            y = y + db[e]
        out.index_add_(0, rows, y * w_sorted[start:start + n, None])
        start += n
    return out
