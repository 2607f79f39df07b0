"""Kernels for ``max.nn.kernels``: ragged batches over the paged KV cache, sampling helpers.

Pool layout: ``blocks[page, 0 (K) | 1 (V), layer, offset, kv_head, head_dim]``.
``ragged_plan`` computes, once per step, the index tensors every layer uses:
where each new token's K/V is written, and for attention a padded
``[batch, q_max]`` query layout and ``[batch, kv_max]`` key layout with a
validity mask, so one SDPA call serves a mixed prefill/decode batch.

:func:`static_decode` (entered while a decode step is captured as a CUDA graph and replayed,
``max.pipelines.lib.cuda_graph_decode``): every request has exactly one new token and keys are
laid out over the lookup table's whole width, so the plans read no value back to the host
(no ``int(tensor)``, no boolean indexing) and every shape follows from the input shapes.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import weakref
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from max.engine.kernels import kernel, preparer
from max.engine.kernels.linalg import half_matmul

# Quantised cache rows (KVCacheParams.is_quantized): head_dim 8-bit codes, then the row's float32 scale.
_QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}
KV_KINDS = {torch.float32: 0, torch.bfloat16: 30, torch.int8: 24, torch.float8_e4m3fn: 66}
"""Native kernels' code for each cache dtype they read and write (``csrc/attention.c``)."""


def kv_is_quantized(blocks: torch.Tensor) -> bool:
    return blocks.dtype in _QMAX


def kv_encode(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``x [..., D]`` as quantised cache rows: uint8 ``[..., D + 4]`` of ``D`` codes (int8 or fp8 e4m3)
    and the row's float32 scale ``amax / qmax`` (symmetric, one scale per row), exactly as the native
    ``lmx_qkv_rope_store`` writes them: ``code = round_half_even(x * (qmax / amax))`` clamped to +-qmax."""
    qmax = _QMAX[dtype]
    xf = x.float()
    amax = xf.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, qmax / amax, torch.zeros_like(amax))
    y = xf * inv
    codes = torch.round(y).clamp(-qmax, qmax).to(torch.int8) if dtype == torch.int8 else \
        y.clamp(-qmax, qmax).to(torch.float8_e4m3fn)
    scale = (amax / qmax).contiguous()
    return torch.cat([codes.view(torch.uint8), scale.view(torch.uint8)], -1)


def kv_decode(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 rows ``[..., D]`` of quantised cache rows ``raw`` (uint8 ``[..., D + 4]``): code * scale."""
    d = raw.shape[-1] - 4
    scale = raw[..., d:].contiguous().view(torch.float32)
    return raw[..., :d].view(dtype).float() * scale


def kv_load(blocks: torch.Tensor, index: tuple) -> torch.Tensor:
    """``blocks[index]`` (rows of the pool): float32 values of a quantised cache, else the stored rows."""
    if blocks.dtype in _QMAX:
        return kv_decode(blocks.view(torch.uint8)[index], blocks.dtype)
    return blocks[index]


def kv_store(blocks: torch.Tensor, index: tuple, x: torch.Tensor) -> None:
    """``blocks[index] = x`` (rows of ``head_dim`` values), quantising for an int8 / fp8 cache."""
    if blocks.dtype in _QMAX:
        blocks.view(torch.uint8)[index] = kv_encode(x, blocks.dtype)
    else:
        blocks[index] = x.to(blocks.dtype)


_STATIC_DECODE: contextvars.ContextVar[bool] = contextvars.ContextVar("libremax_static_decode", default=False)


@contextlib.contextmanager
def static_decode() -> Iterator[None]:
    """Inside: the ragged kernels assume a decode step (one new token per request) and attend over
    ``lookup.shape[1] * page_size`` key slots per request (masked by its length), reading nothing back
    to the host: what a CUDA graph capture needs.  Outside: the general ragged plans."""
    token = _STATIC_DECODE.set(True)
    try:
        yield
    finally:
        _STATIC_DECODE.reset(token)


def is_static_decode() -> bool:
    return _STATIC_DECODE.get()


def _token_layout(offsets: torch.Tensor, cache_lengths: torch.Tensor, dev: torch.device) -> tuple:
    offs = offsets.to(torch.int64).to(dev)
    cl = cache_lengths.to(torch.int64).to(dev)
    n_new = offs[1:] - offs[:-1]  # [B]
    return offs, cl, n_new


@kernel("ragged_write_plan")
def ragged_write_plan(offsets: torch.Tensor, cache_lengths: torch.Tensor, lookup: torch.Tensor,
                      page_size: int) -> tuple:
    dev = lookup.device
    offs, cl, n_new = _token_layout(offsets, cache_lengths, dev)
    lk = lookup.to(torch.int64)
    B = cl.shape[0]
    if _STATIC_DECODE.get():  # one token per request: token b is request b's, at position cache_lengths[b]
        rows = torch.arange(B, device=dev)
        return cl, lk[rows, cl // page_size], cl % page_size
    T = int(offs[-1])
    tok_batch = torch.repeat_interleave(torch.arange(B, device=dev), n_new, output_size=T)
    tok_i = torch.arange(T, device=dev) - offs[:-1][tok_batch]
    tok_pos = cl[tok_batch] + tok_i
    write_page = lk[tok_batch, tok_pos // page_size]
    write_off = tok_pos % page_size
    return tok_pos, write_page, write_off


@kernel("ragged_read_plan")
def ragged_read_plan(offsets: torch.Tensor, cache_lengths: torch.Tensor, lookup: torch.Tensor,
                     page_size: int) -> tuple:
    dev = lookup.device
    offs, cl, n_new = _token_layout(offsets, cache_lengths, dev)
    lk = lookup.to(torch.int64)
    B = cl.shape[0]
    if _STATIC_DECODE.get():  # one query per request; every key slot of the lookup table, masked by length
        qmax, lmax = 1, lk.shape[1] * page_size
    else:
        qmax = int(n_new.max()) if B else 0
        lmax = int((cl + n_new).max()) if B else 0
    total = cl + n_new
    qi = torch.arange(qmax, device=dev)
    q_index = offs[:-1, None] + qi[None, :]  # [B, qmax]
    q_valid = qi[None, :] < n_new[:, None]
    q_index = torch.where(q_valid, q_index, torch.full_like(q_index, -1))
    q_pos = torch.where(q_valid, cl[:, None] + qi[None, :], torch.full_like(q_index, -1))
    kj = torch.arange(lmax, device=dev)
    key_valid = kj[None, :] < total[:, None]
    read_page = torch.gather(lk, 1, (kj // page_size)[None, :].expand(B, lmax).clamp(max=lk.shape[1] - 1))
    read_page = torch.where(key_valid, read_page, torch.zeros_like(read_page))
    read_off = (kj % page_size)[None, :].expand(B, lmax).contiguous()
    # causal mask shared by every layer; padded query rows attend anywhere (their output is dropped)
    causal = key_valid[:, None, :] & (kj[None, None, :] <= q_pos[:, :, None])
    causal = causal | (q_pos[:, :, None] < 0)
    return q_index, read_page, read_off, key_valid, q_pos, causal


@kernel("fused_qkv_ragged_matmul", pure=False)
def fused_qkv_ragged_matmul(x: torch.Tensor, w: torch.Tensor, *rest: torch.Tensor, layer: int, n_heads: int,
                            n_kv_heads: int, head_dim: int, has_bias: bool) -> torch.Tensor:
    if has_bias:
        b, blocks, wp, wo = rest
    else:
        b = None
        blocks, wp, wo = rest
    qkv = half_matmul(x, w.T) if x.dtype in (torch.bfloat16, torch.float16) else torch.matmul(x, w.T)
    if b is not None:
        qkv = qkv + b
    qd, kd = n_heads * head_dim, n_kv_heads * head_dim
    T = x.shape[0]
    k = qkv[:, qd:qd + kd].reshape(T, n_kv_heads, head_dim)
    v = qkv[:, qd + kd:].reshape(T, n_kv_heads, head_dim)
    kv_store(blocks, (wp, 0, layer, wo), k)
    kv_store(blocks, (wp, 1, layer, wo), v)
    return qkv[:, :qd].contiguous()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x [T, H, D]; cos/sin [T, 1, D/2] float32."""
    xf = x.float()
    if interleaved:
        a, b = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    else:
        h = xf.shape[-1] // 2
        a, b = xf[..., :h], xf[..., h:]
        out = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return out.to(x.dtype)


@kernel("ragged_rope_tables")
def ragged_rope_tables(freqs: torch.Tensor, tok_pos: torch.Tensor) -> tuple:
    f = freqs[tok_pos].float()  # [T, D]: (cos, sin) pairs interleaved
    return f[:, 0::2].unsqueeze(1).contiguous(), f[:, 1::2].unsqueeze(1).contiguous()


@kernel("fused_qk_ragged_rope", pure=False)
def fused_qk_ragged_rope(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, blocks: torch.Tensor,
                         wp: torch.Tensor, wo: torch.Tensor, layer: int, interleaved: bool) -> torch.Tensor:
    k = kv_load(blocks, (wp, 0, layer, wo))
    kv_store(blocks, (wp, 0, layer, wo), _rotate(k, cos, sin, interleaved))
    return _rotate(q, cos, sin, interleaved)


@kernel("rms_norm_key_cache", pure=False)
def rms_norm_key_cache(gamma: torch.Tensor, blocks: torch.Tensor, wp: torch.Tensor, wo: torch.Tensor, layer: int,
                       eps: float, weight_offset: float, cols: int, multiply_before_cast: bool) -> None:
    k = kv_load(blocks, (wp, 0, layer, wo))  # [T, H, D]
    shape = k.shape
    kf = k.float().reshape(shape[0], -1, cols)
    normed = kf * torch.rsqrt(kf.pow(2).mean(-1, keepdim=True) + eps)
    g = gamma.float() + weight_offset
    out = (normed * g).to(k.dtype) if multiply_before_cast else normed.to(k.dtype) * (gamma + weight_offset)
    kv_store(blocks, (wp, 0, layer, wo), out.reshape(shape))


def local_mask(mask: torch.Tensor, q_pos: torch.Tensor, L: int, window: int, chunk: int) -> torch.Tensor:
    """``mask`` ``[B, qmax, L]`` narrowed to a query's sliding window (``window > 0``: the last ``window``
    positions) and its own chunk (``chunk > 0``: positions ``chunk * (p // chunk) ..``); padding queries
    (``q_pos < 0``) keep theirs."""
    if window <= 0 and chunk <= 0:
        return mask
    kj = torch.arange(L, device=mask.device)[None, None, :]
    qp = q_pos[:, :, None]
    keep = torch.ones_like(mask)
    if window > 0:
        keep = keep & (kj > qp - window)
    if chunk > 0:
        keep = keep & (kj // chunk == qp // chunk)
    return mask & (keep | (qp < 0))


@kernel("flash_attention_ragged", pure=False)
def flash_attention_ragged(q: torch.Tensor, blocks: torch.Tensor, q_index: torch.Tensor, read_page: torch.Tensor,
                           read_off: torch.Tensor, key_valid: torch.Tensor, q_pos: torch.Tensor,
                           causal_mask: torch.Tensor, *step: torch.Tensor, layer: int, scale: float, causal: bool,
                           window: int, head_dim: int, native_operands: bool = False, chunk: int = -1
                           ) -> torch.Tensor:
    # ``step`` (offsets, cache_lengths, lookup) is for flash_attention_ragged_native; unused here
    shape = q.shape
    T = shape[0]
    q3 = q.reshape(T, -1, head_dim)
    B, qmax = q_index.shape
    if B == 0 or T == 0:
        return q.clone()
    static = _STATIC_DECODE.get()
    kv = kv_load(blocks, (read_page, slice(None), layer, read_off))  # [B, L, 2, Hkv, D]: one gather for K and V
    if static or not bool(key_valid.all()):
        # padding slots may hold stale or uninitialised (even NaN) memory: zero them
        kv.masked_fill_(~key_valid[:, :, None, None, None], 0)
    k, v = kv[:, :, 0], kv[:, :, 1]
    qp = q3[:, None] if static else q3[q_index.clamp(min=0)]  # [B, qmax, H, D] (decode: query b is token b)
    if causal:
        mask = causal_mask
        mask = local_mask(mask, q_pos, k.shape[1], window, chunk)
    else:
        mask = key_valid[:, None, :].expand(B, qmax, -1) | (q_pos[:, :, None] < 0)
    dt = q.dtype
    if dt in (torch.bfloat16, torch.float16) and q.device.type == "cpu":
        qp, k, v = qp.float(), k.float(), v.float()
    else:
        k, v = k.to(qp.dtype), v.to(qp.dtype)
    out = F.scaled_dot_product_attention(qp.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask[:, None], scale=scale,
                                         enable_gqa=qp.shape[2] != k.shape[2])  # [B, H, qmax, D]
    out = out.transpose(1, 2).to(dt)  # [B, qmax, H, D]
    if static:  # decode: query b is token b (qmax == 1), no padding rows to drop
        return out[:, 0].reshape(shape)
    valid = q_index >= 0
    res = torch.empty_like(q3)
    res[q_index[valid]] = out[valid]
    return res.reshape(shape)


def _cache_strides(blocks: torch.Tensor) -> tuple[int, int, int, int]:
    """Element strides of blocks[page, kv, layer, offset, head, dim] (contiguous in head and dim)."""
    return blocks.stride(0), blocks.stride(1), blocks.stride(2), blocks.stride(3)


def _i64(t: torch.Tensor) -> torch.Tensor:
    t = t if t.dtype == torch.int64 else t.to(torch.int64)
    return t if t.is_contiguous() else t.contiguous()


@kernel("flash_attention_ragged_native", pure=False)
def flash_attention_ragged_native(q: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor,
                                  cache_lengths: torch.Tensor, lookup: torch.Tensor, layer: int, scale: float,
                                  causal: bool, window: int, head_dim: int, chunk: int = -1,
                                  native: str = "") -> torch.Tensor:
    """flash_attention_ragged reading the pages in place (the ``native`` kernel variant; CPU, float32 q)."""
    from max.engine.native import library

    shape = q.shape
    T = shape[0]
    q3 = q.reshape(T, -1, head_dim)
    q3 = q3 if q3.is_contiguous() else q3.contiguous()
    out = torch.empty_like(q3)
    H, Hkv = q3.shape[1], blocks.shape[4]
    offs, cl, lk = _i64(offsets), _i64(cache_lengths), _i64(lookup)
    sp, skv, sl, so = _cache_strides(blocks)
    kind = KV_KINDS[blocks.dtype]
    rc = library(native).lmx_paged_attention(
        q3.data_ptr(), T, H, Hkv, head_dim, cl.shape[0], offs.data_ptr(), cl.data_ptr(), lk.data_ptr(), lk.stride(0),
        blocks.shape[3], blocks.data_ptr(), kind, sp, skv, sl, so, layer, scale, window, chunk, int(causal),
        out.data_ptr())
    if rc != 0:
        raise RuntimeError(f"flash_attention_ragged: native kernel failed with code {rc}")
    return out.reshape(shape)


@kernel("ragged_qkv_store", pure=False)
def ragged_qkv_store(qkv: torch.Tensor, *operands: torch.Tensor, layer: int, n_heads: int, n_kv_heads: int,
                     head_dim: int, interleaved: bool, eps: float, has_rope: bool, has_q_norm: bool,
                     has_k_norm: bool, native: str | None = None) -> torch.Tensor:
    """K/V rows (RoPE'd, head-normed) into the paged cache; returns the queries likewise.  One pass of the
    ``native`` kernel variant (set at lowering) where it reads the operands, else torch."""
    it = iter(operands)
    freqs = next(it) if has_rope else None
    qg = next(it) if has_q_norm else None
    kg = next(it) if has_k_norm else None
    blocks, tok_pos, wp, wo = next(it), next(it), next(it), next(it)
    T, D, H, Hkv = qkv.shape[0], head_dim, n_heads, n_kv_heads
    if (native and qkv.device.type == "cpu" and qkv.dtype == torch.float32 and blocks.dtype in KV_KINDS
            and (freqs is None or freqs.dtype == torch.float32) and qkv.stride(1) == 1):
        from max.engine.native import library

        so = library(native)
        q = torch.empty((T, H, D), dtype=torch.float32)
        pos, wp64, wo64 = _i64(tok_pos), _i64(wp), _i64(wo)
        f = None if freqs is None else (freqs if freqs.is_contiguous() else freqs.contiguous())
        sp, skv, sl, sof = _cache_strides(blocks)
        rc = so.lmx_qkv_rope_store(
            qkv.data_ptr(), T, qkv.stride(0), H, Hkv, D, pos.data_ptr(), 0 if f is None else f.data_ptr(),
            0 if f is None else f.shape[0], 0 if f is None else f.shape[1], int(interleaved), 0 if qg is None else qg.contiguous().data_ptr(),
            0 if kg is None else kg.contiguous().data_ptr(), eps, q.data_ptr(), blocks.data_ptr(),
            KV_KINDS[blocks.dtype], sp, skv, sl, sof, layer, wp64.data_ptr(), wo64.data_ptr())
        if rc == -2:
            raise ValueError("ragged_qkv_store: a token position is beyond the rotary table (max_seq_len)")
        if rc != 0:
            raise RuntimeError(f"ragged_qkv_store: native kernel failed with code {rc}")
        return q
    qd, kd = H * D, Hkv * D
    q = qkv[:, :qd].reshape(T, H, D).float()
    k = qkv[:, qd:qd + kd].reshape(T, Hkv, D).float()
    v = qkv[:, qd + kd:].reshape(T, Hkv, D)

    def norm(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g.float()

    if qg is not None:
        q = norm(q, qg)
    if kg is not None:
        k = norm(k, kg)
    if freqs is not None:
        cos, sin = ragged_rope_tables(freqs, tok_pos)
        r = freqs.shape[1]  # partial rotary: the first r dims of each head
        q = torch.cat([_rotate(q[..., :r], cos, sin, interleaved), q[..., r:]], -1)
        k = torch.cat([_rotate(k[..., :r], cos, sin, interleaved), k[..., r:]], -1)
    kv_store(blocks, (wp, 0, layer, wo), k)
    kv_store(blocks, (wp, 1, layer, wo), v)
    return q.to(qkv.dtype)


def _store_split(operands: tuple, has_rope: bool, has_q_norm: bool, has_k_norm: bool) -> tuple:
    """``qkv_attention_native``'s operands after qkv: (store operands, attention's offsets, lengths, lookup)."""
    n = 4 + has_rope + has_q_norm + has_k_norm
    return operands[:n], operands[n:n + 3]


@kernel("qkv_attention_native", pure=False)
def qkv_attention_native(qkv: torch.Tensor, *operands: torch.Tensor, layer: int, n_heads: int, n_kv_heads: int,
                         head_dim: int, interleaved: bool, eps: float, has_rope: bool, has_q_norm: bool,
                         has_k_norm: bool, scale: float, causal: bool, window: int, chunk: int = -1,
                         flat: bool = False, native: str = "") -> torch.Tensor:
    """``ragged_qkv_store`` then ``flash_attention_ragged_native`` of its Q (one node: the native lowering
    fuses the pair); ``flat``: the result as ``[T, H * D]`` (the reshape that followed, absorbed)."""
    store, (offsets, cache_lengths, lookup) = _store_split(operands, has_rope, has_q_norm, has_k_norm)
    q = ragged_qkv_store(qkv, *store, layer=layer, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
                         interleaved=interleaved, eps=eps, has_rope=has_rope, has_q_norm=has_q_norm,
                         has_k_norm=has_k_norm, native=native)
    out = flash_attention_ragged_native(q, store[-4], offsets, cache_lengths, lookup, layer=layer, scale=scale,
                                        causal=causal, window=window, head_dim=head_dim, chunk=chunk, native=native)
    return out.reshape(out.shape[0], -1) if flat else out


@preparer("qkv_attention_native")
def prepare_qkv_attention_native(operands: list, layer: int, n_heads: int, n_kv_heads: int, head_dim: int,
                                 interleaved: bool, eps: float, has_rope: bool, has_q_norm: bool, has_k_norm: bool,
                                 scale: float, causal: bool, window: int, chunk: int = -1, flat: bool = False,
                                 native: str = "") -> Any:
    """With the rotary table / head norms bound: one native call per step (``lmx_qkv_attention``) with the
    layer's settings prepared once; anything unusual (dtypes, layouts) takes the unprepared kernel."""
    from max.engine import native as lmx

    nconst = has_rope + has_q_norm + has_k_norm
    consts = operands[1:1 + nconst]
    if not native or any(c is None for c in consts) or any(o is not None for o in operands[1 + nconst:]):
        return None
    so = lmx.library(native)
    it = iter(consts)
    freqs = next(it) if has_rope else None
    qg = next(it) if has_q_norm else None
    kg = next(it) if has_k_norm else None
    if (any(t is not None and (t.dtype != torch.float32 or not t.is_cpu) for t in (freqs, qg, kg))
            or head_dim > 1024):
        return None
    keep = [None if t is None else t.contiguous() for t in (freqs, qg, kg)]
    freqs, qg, kg = keep
    attrs = dict(layer=layer, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim, interleaved=interleaved,
                 eps=eps, has_rope=has_rope, has_q_norm=has_q_norm, has_k_norm=has_k_norm, scale=scale,
                 causal=causal, window=window, chunk=chunk, flat=flat, native=native)
    p = lmx.QkvAttention(H=n_heads, Hkv=n_kv_heads, D=head_dim, freqs=None if freqs is None else freqs.data_ptr(),
                            max_pos=0 if freqs is None else freqs.shape[0], R=0 if freqs is None else freqs.shape[1],
                            interleaved=int(interleaved), q_gamma=None if qg is None else qg.data_ptr(),
                            k_gamma=None if kg is None else kg.data_ptr(), eps=eps, scale=scale, layer=layer,
                            window=window, chunk=chunk, causal=int(causal))
    pref = ctypes.byref(p)
    fn = so.lmx_qkv_attention
    f32, i64, empty = torch.float32, torch.int64, torch.empty
    H, D = n_heads, head_dim
    width = (n_heads + 2 * n_kv_heads) * head_dim
    none = lambda: None  # noqa: E731
    bound: list = [none]  # a weak reference to the cache tensor whose layout p holds

    def run(qkv: torch.Tensor, blocks: torch.Tensor, pos: torch.Tensor, wp: torch.Tensor, wo: torch.Tensor,
            offs: torch.Tensor, cl: torch.Tensor, lk: torch.Tensor) -> torch.Tensor:
        if blocks is not bound[0]():
            if (blocks.dtype not in KV_KINDS or blocks.dim() != 6 or not blocks.is_cpu
                    or blocks.stride(5) != 1 or blocks.stride(4) != blocks.shape[5]):
                return qkv_attention_native(qkv, *_consts(), blocks, pos, wp, wo, offs,
                                            cl, lk, **attrs)
            p.kv_kind = KV_KINDS[blocks.dtype]
            p.s_page, p.s_kv, p.s_layer, p.s_off = _cache_strides(blocks)
            p.page_size = blocks.shape[3]
            bound[0] = weakref.ref(blocks)
        if (qkv.dtype is not f32 or not qkv.is_cpu or qkv.dim() != 2 or qkv.stride(1) != 1 or qkv.shape[1] != width
                or pos.dtype is not i64 or wp.dtype is not i64 or wo.dtype is not i64 or offs.dtype is not i64
                or cl.dtype is not i64 or lk.dtype is not i64 or not pos.is_contiguous() or not wp.is_contiguous()
                or not wo.is_contiguous() or not offs.is_contiguous() or not cl.is_contiguous()
                or lk.stride(-1) != 1):
            return qkv_attention_native(qkv, *_consts(), blocks, pos, wp, wo, offs, cl, lk, **attrs)
        T = qkv.shape[0]
        out = empty(T, H * D, dtype=f32) if flat else empty(T, H, D, dtype=f32)
        rc = fn(pref, qkv.data_ptr(), T, qkv.stride(0), pos.data_ptr(), wp.data_ptr(), wo.data_ptr(), cl.shape[0],
                offs.data_ptr(), cl.data_ptr(), lk.data_ptr(), lk.stride(0), blocks.data_ptr(), out.data_ptr())
        if rc == -2:
            raise ValueError("ragged_qkv_store: a token position is beyond the rotary table (max_seq_len)")
        if rc != 0:
            raise RuntimeError(f"qkv_attention_native: native kernel failed with code {rc}")
        return out

    def _consts() -> list:
        return [t for t in keep if t is not None]

    return run


@kernel("kv_cache_get_max_seq_len")
def kv_cache_get_max_seq_len(max_lengths: torch.Tensor) -> torch.Tensor:
    return max_lengths[0, 1].clone()


@kernel("topk_fused_sampling", pure=False)
def topk_fused_sampling(logits: torch.Tensor, top_k: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                        seed: torch.Tensor) -> torch.Tensor:
    B, V = logits.shape
    x = logits.float()
    k = top_k.expand(B) if top_k.numel() == 1 else top_k
    t = temperature.expand(B) if temperature.numel() == 1 else temperature
    p = top_p.expand(B) if top_p.numel() == 1 else top_p
    kmax = int(min(int(k.max()), V))
    vals, idx = torch.topk(x, kmax, dim=-1)
    greedy = (t <= 0) | (k <= 1)
    tt = torch.where(greedy, torch.ones_like(t), t)
    scaled = vals / tt[:, None]
    ranks = torch.arange(kmax, device=x.device)[None, :]
    scaled = scaled.masked_fill(ranks >= k[:, None], float("-inf"))
    probs = torch.softmax(scaled, -1)
    cum = probs.cumsum(-1) - probs
    probs = probs.masked_fill(cum >= p[:, None], 0.0)
    probs = probs / probs.sum(-1, keepdim=True)
    gen = torch.Generator(device=x.device)
    gen.manual_seed(int(seed.reshape(-1)[0]))
    choice = torch.multinomial(probs, 1, generator=gen)
    choice = torch.where(greedy[:, None], torch.zeros_like(choice), choice)
    return torch.gather(idx, 1, choice)


@kernel("apply_penalties_to_logits", pure=False)
def apply_penalties_to_logits(logits: torch.Tensor, fdata: torch.Tensor, foffs: torch.Tensor, fpen: torch.Tensor,
                              ppen: torch.Tensor, rpen: torch.Tensor) -> None:
    offs = foffs.to(torch.int64)
    B = offs.shape[0] - 1
    n = offs[1:] - offs[:-1]
    rows = torch.repeat_interleave(torch.arange(B, device=logits.device), n.to(logits.device))
    tok = fdata[:, 0].to(torch.int64)
    cnt = fdata[:, 1].to(logits.dtype)
    keep = tok >= 0
    rows, tok, cnt = rows[keep], tok[keep], cnt[keep]
    cur = logits[rows, tok]

    def per_row(v: torch.Tensor) -> torch.Tensor:
        return v.reshape(-1)[0] if v.numel() == 1 else v.reshape(-1)[rows]

    r = per_row(rpen).to(cur.dtype)
    cur = torch.where(cur > 0, cur / r, cur * r)
    cur = cur - per_row(fpen).to(cur.dtype) * cnt - per_row(ppen).to(cur.dtype) * (cnt > 0).to(cur.dtype)
    logits[rows, tok] = cur


@kernel("update_frequency_data", pure=False)
def update_frequency_data(fdata: torch.Tensor, foffs: torch.Tensor, tokens: torch.Tensor) -> None:
    offs = foffs.to(torch.int64).tolist()
    toks = tokens.reshape(-1).to(torch.int64).tolist()
    for b, t in enumerate(toks):
        seg = fdata[offs[b]:offs[b + 1]]
        hit = (seg[:, 0] == t).nonzero()
        if hit.numel():
            seg[hit[0, 0], 1] += 1
        else:
            free = (seg[:, 0] < 0).nonzero()
            if free.numel():
                seg[free[0, 0], 0] = t
                seg[free[0, 0], 1] = 1


@kernel("merge_ragged_tensors")
def merge_ragged_tensors(a: torch.Tensor, ao: torch.Tensor, b: torch.Tensor, bo: torch.Tensor) -> tuple:
    ao64, bo64 = ao.to(torch.int64), bo.to(torch.int64)
    parts = []
    for i in range(ao64.shape[0] - 1):
        parts.append(a[ao64[i]:ao64[i + 1]])
        parts.append(b[bo64[i]:bo64[i + 1]])
    merged = torch.cat(parts) if parts else a[:0]
    return merged, (ao64 + bo64).to(ao.dtype)


@kernel("scatter_set_constant", pure=False)
def scatter_set_constant(data: torch.Tensor, idx: torch.Tensor, fill_val: float) -> None:
    data[tuple(idx.to(torch.int64).T)] = fill_val
