"""Kernels for ``max.nn.kernels_decoder`` (RoPE on projected q/k, K/V rows into the paged cache).

Its write plan and RoPE tables are ``max.nn.kernels``' (kernels in ``ragged``).

Pool layout as in ``ragged``: ``blocks[page, 0 (K) | 1 (V), layer, offset, kv_head, head_dim]``.
"""

from __future__ import annotations

import torch

from max.engine.kernels import kernel
from max.engine.kernels.ragged import KV_KINDS, kv_load, kv_store, local_mask


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
def store_kv_ragged(k: torch.Tensor, *rest: torch.Tensor, layer: int, has_v: bool = True) -> None:
    v, blocks, write_page, write_offset = rest if has_v else (None, *rest)
    kv_store(blocks, (write_page, 0, layer, write_offset), k)
    if v is not None:
        kv_store(blocks, (write_page, 1, layer, write_offset), v)


@kernel("ragged_attention", pure=False)
def ragged_attention(q: torch.Tensor, blocks: torch.Tensor, q_index: torch.Tensor, read_page: torch.Tensor,
                     read_off: torch.Tensor, key_valid: torch.Tensor, q_pos: torch.Tensor, causal_mask: torch.Tensor,
                     *extra: torch.Tensor, layer: int, scale: float, window: int, softcap: float,
                     has_sinks: bool, has_groups: bool = False, chunk: int = 0,
                     native: str | None = None) -> torch.Tensor:
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
                           cache_lengths, lookup, layer, scale, window, chunk, native)
        mask = mask | _same_block(groups, q_index, q_pos, key_valid)
    mask = local_mask(mask, q_pos, k.shape[1], window, chunk)  # sliding window / chunked local attention
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
            window: int, chunk: int = -1, native: str | None = None) -> torch.Tensor:
    """Causal attention as ``flash_attention_ragged`` computes it: the paged kernel of the ``native`` variant
    (the node's, set at lowering) where it reads the operands (CPU, float32 queries, a cache dtype it reads),
    else its SDPA path."""
    from max.engine.kernels.ragged import flash_attention_ragged, flash_attention_ragged_native

    D = q.shape[-1]
    if native and q.device.type == "cpu" and q.dtype == torch.float32 and blocks.dtype in KV_KINDS:
        return flash_attention_ragged_native(q, blocks, offsets, cache_lengths, lookup, layer=layer, scale=scale,
                                             causal=True, window=window, head_dim=D, chunk=chunk, native=native)
    return flash_attention_ragged(q, blocks, q_index, read_page, read_off, key_valid, q_pos, causal_mask,
                                  layer=layer, scale=scale, causal=True, window=window, head_dim=D, chunk=chunk)


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


# ----------------------------------------------------------------- MLA prefill in chunks (max.nn.kernels_mla)
def _cached_rows(blocks: torch.Tensor, lookup: torch.Tensor, req: torch.Tensor, pos: torch.Tensor, layer: int,
                 page_size: int) -> torch.Tensor:
    """The latent rows (K-plane half then V-plane half) of requests ``req`` at positions ``pos``: ``[n, width]``."""
    page = lookup.to(torch.int64)[req, pos // page_size]
    rows = blocks[page, :, layer, pos % page_size]  # [n, 2, 1, width/2]
    return rows.reshape(rows.shape[0], -1)


def _row_owner(bro: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For buffer rows ``0 .. rows``: the request owning each (by ``bro`` prefix sums) and whether any does."""
    r = torch.arange(rows, device=bro.device)
    b = torch.searchsorted(bro[1:], r, right=True)
    return b.clamp(max=bro.shape[0] - 2), (r >= bro[0]) & (r < bro[-1])


@kernel("flare_mla_prefill_plan", pure=False)
def flare_mla_prefill_plan(offsets: torch.Tensor, cache_lengths: torch.Tensor, buffer_size: int,
                           max_chunks: int) -> tuple:
    offs = offsets.to(torch.int64)
    total = cache_lengths.to(torch.int64).to(offs.device) + (offs[1:] - offs[:-1])
    start = torch.cat([total.new_zeros(1), torch.cumsum(total, 0)])  # [B + 1]
    n_all = int(start[-1])
    if n_all > buffer_size * max_chunks:
        raise ValueError(f"flare_mla_prefill_plan: {n_all} cached positions need more than max_chunks={max_chunks} "
                         f"chunks of {buffer_size}")
    c0 = torch.arange(max_chunks, device=offs.device)[:, None] * buffer_size  # [C, 1]
    bro = (start[None, :] - c0).clamp(0, buffer_size)
    co = torch.minimum((c0 - start[None, :-1]).clamp(min=0), total[None, :])
    lengths = (n_all - c0[:, 0]).clamp(max=buffer_size)
    lengths = torch.where(lengths > 0, lengths, torch.full_like(lengths, -1))
    return bro.to(torch.int32), co.to(torch.int32), lengths.to(torch.int32)


@kernel("flare_mla_decompress_k_cache", pure=False)
def flare_mla_decompress_k_cache(bro: torch.Tensor, co: torch.Tensor, length: torch.Tensor, w: torch.Tensor,
                                 blocks: torch.Tensor, lookup: torch.Tensor, layer: int, page_size: int,
                                 buffer_size: int) -> torch.Tensor:
    out = w.new_zeros(buffer_size, w.shape[0])
    n = min(int(length), buffer_size)
    if n <= 0:
        return out
    bro64 = bro.to(torch.int64)
    req, _ = _row_owner(bro64, n)
    pos = co.to(torch.int64)[req] + torch.arange(n, device=bro.device) - bro64[req]
    lat = _cached_rows(blocks, lookup, req, pos, layer, page_size)[:, :w.shape[1]]
    out[:n] = (lat.float() @ w.float().T).to(w.dtype)
    return out


@kernel("flare_mla_prefill_ragged", pure=False)
def flare_mla_prefill_ragged(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
                             bro: torch.Tensor, co: torch.Tensor, blocks: torch.Tensor, cache_lengths: torch.Tensor,
                             lookup: torch.Tensor, *prev: torch.Tensor, layer: int, scale: float, rope_dim: int,
                             page_size: int, has_prev: bool) -> tuple:
    T, H, _ = q.shape
    dev = q.device
    offs, bro64 = offsets.to(torch.int64), bro.to(torch.int64)
    nbuf = int(bro64[-1]) if bro64.numel() else 0
    m = torch.full((T, H), float("-inf"), device=dev)
    s_exp = torch.zeros(T, H, device=dev)
    o = torch.zeros(T, H, v.shape[2], device=dev)
    if nbuf > 0 and T > 0:
        kreq, _ = _row_owner(bro64, nbuf)
        kpos = co.to(torch.int64)[kreq] + torch.arange(nbuf, device=dev) - bro64[kreq]
        rows = _cached_rows(blocks, lookup, kreq, kpos, layer, page_size).float()
        k_rope = rows[:, rows.shape[1] - rope_dim:] if rope_dim else rows[:, :0]
        keys = torch.cat([k[:nbuf].float(), k_rope[:, None, :].expand(nbuf, H, rope_dim)], dim=-1)  # [n, H, qk]
        qreq = torch.searchsorted(offs[1:], torch.arange(T, device=dev), right=True)
        qpos = cache_lengths.to(torch.int64).to(dev)[qreq] + torch.arange(T, device=dev) - offs[qreq]
        allowed = (qreq[:, None] == kreq[None, :]) & (kpos[None, :] <= qpos[:, None])  # [T, n]
        scores = torch.einsum("thd,nhd->htn", q.float(), keys) * scale
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        m = scores.amax(-1).T  # [T, H]
        safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(scores - safe.T[:, :, None])  # [H, T, n]; masked -> 0
        s_exp = p.sum(-1).T
        o = torch.einsum("htn,nhd->thd", p, v[:nbuf].float()) / s_exp.clamp(min=1e-30)[:, :, None]
    if has_prev:
        po, pi = prev[0].float(), prev[1].float()
        pm, ps = pi[..., 0], pi[..., 1]
        new_m = torch.maximum(pm, m)
        base = torch.where(torch.isfinite(new_m), new_m, torch.zeros_like(new_m))
        wa = torch.where(ps > 0, ps * torch.exp(pm - base), torch.zeros_like(ps))
        wb = torch.where(s_exp > 0, s_exp * torch.exp(m - base), torch.zeros_like(s_exp))
        tot = wa + wb
        o = (po * wa[..., None] + o * wb[..., None]) / tot.clamp(min=1e-30)[..., None]
        m, s_exp = new_m, tot  # the sum of exponentials relative to the new max
    info = torch.stack([m, s_exp], dim=-1)
    return o.to(q.dtype), info
