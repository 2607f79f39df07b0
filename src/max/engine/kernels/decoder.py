"""Kernels for ``max.nn.kernels_decoder`` (RoPE on projected q/k, K/V rows into the paged cache).

Its write plan and RoPE tables are ``max.nn.kernels``' (kernels in ``ragged``).

Pool layout as in ``ragged``: ``blocks[page, 0 (K) | 1 (V), layer, offset, kv_head, head_dim]``.
"""

from __future__ import annotations

import torch

from max.engine.kernels import kernel
from max.engine.kernels.ragged import KV_KINDS, kv_load, kv_store


@kernel("ragged_rope")
def ragged_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    rot = 2 * cos.shape[-1]
    xf = x[..., :rot].float()
    if interleaved:
        a, b = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    else:
        h = rot // 2
        a, b = xf[..., :h], xf[..., h:]
        out = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    out = out.to(x.dtype)
    if rot == x.shape[-1]:
        return out
    return torch.cat((out, x[..., rot:]), dim=-1)


@kernel("store_kv_ragged", pure=False)
def store_kv_ragged(k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor, write_page: torch.Tensor,
                    write_offset: torch.Tensor, layer: int) -> None:
    kv_store(blocks, (write_page, 0, layer, write_offset), k)
    kv_store(blocks, (write_page, 1, layer, write_offset), v)


@kernel("ragged_attention", pure=False)
def ragged_attention(q: torch.Tensor, blocks: torch.Tensor, q_index: torch.Tensor, read_page: torch.Tensor,
                     read_off: torch.Tensor, key_valid: torch.Tensor, q_pos: torch.Tensor, causal_mask: torch.Tensor,
                     *extra: torch.Tensor, layer: int, scale: float, window: int, softcap: float,
                     has_sinks: bool, has_groups: bool = False) -> torch.Tensor:
    T, H, D = q.shape
    B = q_index.shape[0]
    if B == 0 or T == 0:
        return q.clone()
    kv = kv_load(blocks, (read_page, slice(None), layer, read_off)).float()  # [B, L, 2, Hkv, D]
    kv.masked_fill_(~key_valid[:, :, None, None, None], 0)
    k, v = kv[:, :, 0], kv[:, :, 1]
    if k.shape[2] != H:
        k, v = k.repeat_interleave(H // k.shape[2], dim=2), v.repeat_interleave(H // v.shape[2], dim=2)
    qp = q[q_index.clamp(min=0)].float()  # [B, qmax, H, D]
    mask = causal_mask
    if has_groups:
        groups, offsets, cache_lengths, lookup = extra[int(has_sinks):int(has_sinks) + 4]
        if not has_sinks and softcap <= 0 and not bool((groups >= 0).any()):  # no block: plain causal attention
            return _causal(q, blocks, q_index, read_page, read_off, key_valid, q_pos, causal_mask, offsets,
                           cache_lengths, lookup, layer, scale, window)
        mask = mask | _same_block(groups, q_index, q_pos, key_valid)
    if window > 0:
        kj = torch.arange(k.shape[1], device=q.device)
        mask = mask & ((kj[None, None, :] > q_pos[:, :, None] - window) | (q_pos[:, :, None] < 0))
    scores = torch.einsum("bqhd,bkhd->bhqk", qp, k) * scale
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    if has_sinks:
        sink = extra[0].float()[None, :, None, None].expand(B, H, scores.shape[2], 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v).to(q.dtype)
    valid = q_index >= 0
    res = torch.empty_like(q)
    res[q_index[valid]] = out[valid]
    return res


def _causal(q: torch.Tensor, blocks: torch.Tensor, q_index: torch.Tensor, read_page: torch.Tensor,
            read_off: torch.Tensor, key_valid: torch.Tensor, q_pos: torch.Tensor, causal_mask: torch.Tensor,
            offsets: torch.Tensor, cache_lengths: torch.Tensor, lookup: torch.Tensor, layer: int, scale: float,
            window: int) -> torch.Tensor:
    """Causal attention as ``flash_attention_ragged`` computes it: the native paged kernel where the native
    lowering would pick it (CPU, float32 queries, float32/bfloat16 cache), else its SDPA path."""
    from max.engine import native
    from max.engine.kernels.ragged import flash_attention_ragged, flash_attention_ragged_native

    D = q.shape[-1]
    if q.device.type == "cpu" and q.dtype == torch.float32 and blocks.dtype in KV_KINDS and native.lib() is not None:
        return flash_attention_ragged_native(q, blocks, offsets, cache_lengths, lookup, layer=layer, scale=scale,
                                             causal=True, window=window, head_dim=D)
    return flash_attention_ragged(q, blocks, q_index, read_page, read_off, key_valid, q_pos, causal_mask,
                                  layer=layer, scale=scale, causal=True, window=window, head_dim=D)


def _same_block(groups: torch.Tensor, q_index: torch.Tensor, q_pos: torch.Tensor, key_valid: torch.Tensor
                ) -> torch.Tensor:
    """``[B, qmax, L]``: query and key are tokens of this step with the same block id (>= 0).  A request's
    tokens in this step are its positions ``q_pos[b, 0] ..``, so key position ``j`` is the step's token
    ``q_index[b, j - q_pos[b, 0]]`` when that is in range."""
    qmax, L = q_index.shape[1], key_valid.shape[1]
    gq = torch.where(q_index >= 0, groups[q_index.clamp(min=0)], -1)  # [B, qmax]
    rel = torch.arange(L, device=q_index.device)[None, :] - q_pos[:, :1]  # [B, L]
    in_step = (rel >= 0) & (rel < qmax)
    kidx = q_index.gather(1, rel.clamp(0, qmax - 1))
    gk = torch.where(in_step & (kidx >= 0) & key_valid, groups[kidx.clamp(min=0)], -1)  # [B, L]
    return (gq[:, :, None] == gk[:, None, :]) & (gq[:, :, None] >= 0)


@kernel("mla_attention_ragged", pure=False)
def mla_attention_ragged(q: torch.Tensor, blocks: torch.Tensor, q_index: torch.Tensor, read_page: torch.Tensor,
                         read_off: torch.Tensor, key_valid: torch.Tensor, q_pos: torch.Tensor,
                         causal_mask: torch.Tensor, layer: int, scale: float, latent_dim: int) -> torch.Tensor:
    T, H, W = q.shape
    B = q_index.shape[0]
    if B == 0 or T == 0:
        return q.new_zeros(T, H, latent_dim)
    rows = kv_load(blocks, (read_page, slice(None), layer, read_off)).float()  # [B, L, 2, 1, W/2]: the latent's halves
    rows = rows.reshape(B, rows.shape[1], W).masked_fill(~key_valid[:, :, None], 0)
    qp = q[q_index.clamp(min=0)].float()  # [B, qmax, H, W]
    scores = torch.einsum("bqhw,bkw->bhqk", qp, rows) * scale
    probs = torch.softmax(scores.masked_fill(~causal_mask[:, None], float("-inf")), dim=-1)
    out = torch.einsum("bhqk,bkc->bqhc", probs, rows[..., :latent_dim]).to(q.dtype)
    valid = q_index >= 0
    res = q.new_empty(T, H, latent_dim)
    res[q_index[valid]] = out[valid]
    return res
