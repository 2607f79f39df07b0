"""Kernels for ``max.nn.kernels_attention``: attention of q/k/v tensors without a cache (padded and
ragged), cross attention over the paged cache, and adding into cache slots.

Pool layout as in ``ragged``: ``blocks[page, 0 (K) | 1 (V), layer, offset, kv_head, head_dim]``.
Softmax in float32; a query row whose keys are all masked gets zeros.
"""

from __future__ import annotations

import torch

from max.engine.kernels import kernel


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float) -> torch.Tensor:
    """q ``[B, Sq, H, D]``, k/v ``[B, Sk, Hkv, D]``, allowed ``[B, Sq, Sk]`` -> ``[B, Sq, H, D]`` (q's dtype)."""
    H, Hkv = q.shape[2], k.shape[2]
    kf, vf = k.float(), v.float()
    if Hkv != H:
        kf, vf = kf.repeat_interleave(H // Hkv, dim=2), vf.repeat_interleave(H // Hkv, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), kf) * scale
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # fully masked rows: zeros
    return torch.einsum("bhqk,bkhd->bqhd", probs, vf).to(q.dtype)


def _allowed(q_pos: torch.Tensor, k_pos: torch.Tensor, q_valid: torch.Tensor, k_valid: torch.Tensor, causal: bool,
             window: int) -> torch.Tensor:
    """``[B, Sq, Sk]`` from positions ``q_pos [B, Sq]`` / ``k_pos [B, Sk]`` and validity masks."""
    ok = q_valid[:, :, None] & k_valid[:, None, :]
    if causal:
        ok = ok & (k_pos[:, None, :] <= q_pos[:, :, None])
    if window > 0:
        ok = ok & (k_pos[:, None, :] > q_pos[:, :, None] - window)
    return ok


@kernel("flash_attention_padded")
def flash_attention_padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: torch.Tensor, scale: float,
                           causal: bool, window: int, has_valid: bool) -> torch.Tensor:
    B, Sq, Sk = q.shape[0], q.shape[1], k.shape[1]
    dev = q.device
    lens = rest[0].to(torch.int64).to(dev) if has_valid else torch.full((B,), Sk, dtype=torch.int64, device=dev)
    qi = torch.arange(Sq, device=dev)[None, :].expand(B, Sq)
    kj = torch.arange(Sk, device=dev)[None, :].expand(B, Sk)
    # queries are the last Sq positions of the Sk keys (Sq == Sk: the usual square mask)
    q_pos = qi + (Sk - Sq)
    allowed = _allowed(q_pos, kj, q_pos < lens[:, None], kj < lens[:, None], causal, window)
    out = _attend(q, k, v, allowed, scale)
    if has_valid:
        out = out.masked_fill(~(q_pos < lens[:, None])[:, :, None, None], 0)
    return out


def _pad_ragged(x: torch.Tensor, offsets: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[T, ...]`` -> ``[B, width, ...]`` (zeros past each request's length) and the row index map."""
    offs = offsets.to(torch.int64).to(x.device)
    n = offs[1:] - offs[:-1]
    B = n.shape[0]
    i = torch.arange(width, device=x.device)
    valid = i[None, :] < n[:, None]
    idx = torch.where(valid, offs[:-1, None] + i[None, :], torch.zeros_like(valid, dtype=torch.int64))
    padded = x[idx.reshape(-1)].reshape(B, width, *x.shape[1:])
    return padded.masked_fill(~valid.reshape(B, width, *([1] * (x.dim() - 1))), 0), torch.where(valid, idx, -1)


@kernel("flash_attention_ragged_nocache")
def flash_attention_ragged_nocache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
                                   scale: float, causal: bool, window: int) -> torch.Tensor:
    offs = offsets.to(torch.int64)
    n = offs[1:] - offs[:-1]
    if n.numel() == 0 or q.shape[0] == 0:
        return torch.zeros_like(q)
    width = int(n.max())
    qp, idx = _pad_ragged(q, offs, width)
    kp, _ = _pad_ragged(k, offs, width)
    vp, _ = _pad_ragged(v, offs, width)
    pos = torch.arange(width, device=q.device)[None, :].expand(n.shape[0], width)
    valid = idx >= 0
    out = _attend(qp, kp, vp, _allowed(pos, pos, valid, valid, causal, window), scale)
    res = torch.zeros_like(q)
    res[idx[valid]] = out[valid]
    return res


@kernel("cross_attention_ragged", pure=False)
def cross_attention_ragged(q: torch.Tensor, blocks: torch.Tensor, lookup: torch.Tensor, offsets: torch.Tensor,
                           kv_offsets: torch.Tensor, layer: int, scale: float, causal: bool, window: int,
                           head_dim: int, page_size: int) -> torch.Tensor:
    shape = q.shape
    q3 = q.reshape(shape[0], -1, head_dim)
    dev = q.device
    offs, kv_offs = offsets.to(torch.int64).to(dev), kv_offsets.to(torch.int64).to(dev)
    nq, nk = offs[1:] - offs[:-1], kv_offs[1:] - kv_offs[:-1]
    B = nq.shape[0]
    if B == 0 or shape[0] == 0:
        return torch.zeros_like(q)
    qw, kw = int(nq.max()), max(int(nk.max()), 1)
    qp, idx = _pad_ragged(q3, offs, qw)
    kj = torch.arange(kw, device=dev)[None, :].expand(B, kw)
    k_valid = kj < nk[:, None]
    lk = lookup.to(torch.int64).to(dev)
    page = torch.gather(lk, 1, (kj // page_size).clamp(max=lk.shape[1] - 1))
    page = torch.where(k_valid, page, torch.zeros_like(page))
    kv = blocks[page, :, layer, kj % page_size]  # [B, kw, 2, Hkv, D]
    qpos = torch.arange(qw, device=dev)[None, :].expand(B, qw)
    out = _attend(qp, kv[:, :, 0], kv[:, :, 1], _allowed(qpos, kj, idx >= 0, k_valid, causal, window), scale)
    res = torch.zeros_like(q3)
    valid = idx >= 0
    res[idx[valid]] = out[valid]
    return res.reshape(shape)


@kernel("kv_cache_ragged_radd", pure=False)
def kv_cache_ragged_radd(a: torch.Tensor, blocks: torch.Tensor, write_page: torch.Tensor, write_off: torch.Tensor,
                         offsets: torch.Tensor, batch_offset: torch.Tensor, layer: int, n_kv_heads: int,
                         head_dim: int) -> None:
    start = int(offsets.to(torch.int64)[int(batch_offset)])
    rows = a.shape[0]
    if rows == 0:
        return
    if start + rows > write_page.shape[0]:
        raise ValueError(f"kv_cache_ragged_radd: {rows} rows from token {start} exceed the step's "
                         f"{write_page.shape[0]} tokens")
    wp, wo = write_page[start:start + rows], write_off[start:start + rows]
    kd = n_kv_heads * head_dim
    for plane, part in ((0, a[:, :kd]), (1, a[:, kd:])):
        cur = blocks[wp, plane, layer, wo]
        blocks[wp, plane, layer, wo] = (cur.float() + part.float().reshape(cur.shape)).to(blocks.dtype)


@kernel("cross_attention_ragged_native", pure=False)
def cross_attention_ragged_native(q: torch.Tensor, blocks: torch.Tensor, lookup: torch.Tensor, offsets: torch.Tensor,
                                  kv_offsets: torch.Tensor, layer: int, scale: float, causal: bool, window: int,
                                  head_dim: int, page_size: int, native: str = "") -> torch.Tensor:
    """cross_attention_ragged without a mask, reading the pages in place (native kernel; CPU, float32 q):
    ``lmx_paged_attention`` without its causal mask lets request ``b``'s queries see positions
    ``0 .. cache_len[b] + n[b] - 1``, so ``cache_len = kv_len - n`` gives the keys ``0 .. kv_len - 1``.
    ``native``: the kernel variant (set at lowering)."""
    from max.engine.native import library
    from max.engine.kernels.ragged import KV_KINDS, _cache_strides, _i64

    if causal or window > 0:  # the lowering only picks this kernel without a mask
        raise ValueError("cross_attention_ragged_native: only the null mask reads the pages natively")
    shape = q.shape
    T = shape[0]
    q3 = q.reshape(T, -1, head_dim)
    q3 = q3 if q3.is_contiguous() else q3.contiguous()
    out = torch.empty_like(q3)
    offs, kv_offs = _i64(offsets), _i64(kv_offsets)
    n, kv_len = offs[1:] - offs[:-1], kv_offs[1:] - kv_offs[:-1]
    cl = (kv_len - n).contiguous()
    lk = _i64(lookup)
    sp, skv, sl, so = _cache_strides(blocks)
    rc = library(native).lmx_paged_attention(
        q3.data_ptr(), T, q3.shape[1], blocks.shape[4], head_dim, cl.shape[0], offs.data_ptr(), cl.data_ptr(),
        lk.data_ptr(), lk.stride(0), page_size, blocks.data_ptr(), KV_KINDS[blocks.dtype], sp, skv, sl, so, layer,
        scale, -1, -1, 0, out.data_ptr())
    if rc != 0:
        raise RuntimeError(f"cross_attention_ragged: native kernel failed with code {rc}")
    return out.reshape(shape)
