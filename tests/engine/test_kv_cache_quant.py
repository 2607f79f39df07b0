"""The int8 / fp8 e4m3 KV cache rows (``--kv-cache-dtype``): the torch row codec against an independent
float64 reference, the native store bit-identical to it in every kernel variant this CPU runs, and the
native paged attention reading quantised pages in place against a float64 softmax over the decoded
cache (the ARM variants: ``test_native_kernels_arm.py``)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from max.engine import native
from max.engine.kernels.ragged import KV_KINDS, flash_attention_ragged, kv_decode, kv_encode, ragged_read_plan
from test_native_kernels import ISAS, assert_paged_attention  # noqa: E402

QDTYPES = [torch.int8, torch.float8_e4m3fn]


def _e4m3_values() -> np.ndarray:
    """Every finite fp8 e4m3fn value (from the format: 4 exponent bits, bias 7, 3 mantissa bits, no inf)."""
    vals = []
    for e in range(16):
        for m in range(8):
            if e == 15 and m == 7:
                continue  # NaN
            vals.append(m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    v = np.array(vals)
    return np.concatenate([-v[::-1], v])


def _reference_codes(x: np.ndarray, dtype: torch.dtype) -> tuple[np.ndarray, np.ndarray]:
    """float64 reference of the documented scheme: scale = amax / qmax per row; value = nearest code
    (ties to even) to x * qmax / amax, clamped to +-qmax, times the scale."""
    x32 = x.astype(np.float32)
    amax = np.abs(x32).max(-1, keepdims=True)
    qmax = np.float32(127.0 if dtype == torch.int8 else 448.0)
    inv = np.where(amax > 0, qmax / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    y = np.clip((x32 * inv).astype(np.float64), -float(qmax), float(qmax))
    if dtype == torch.int8:
        codes = np.clip(np.round(y), -127, 127)  # numpy rounds half to even
    else:
        grid = _e4m3_values()
        idx = np.searchsorted(grid, y)
        lo, hi = grid[np.clip(idx - 1, 0, len(grid) - 1)], grid[np.clip(idx, 0, len(grid) - 1)]
        dlo, dhi = y - lo, hi - y
        # ties: the code with an even mantissa (its bit pattern ends in 0)
        even_hi = _even(hi)
        codes = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(even_hi, hi, lo)))
    return codes, (amax / qmax).astype(np.float32)


def _even(v: np.ndarray) -> np.ndarray:
    """Whether each (exactly representable) e4m3fn value has an even mantissa field."""
    t = torch.from_numpy(v.astype(np.float32)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    return (t & 1) == 0


@pytest.mark.parametrize("dtype", QDTYPES)
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), d=st.sampled_from([8, 16, 24, 64]), mag=st.floats(1e-4, 1e3))
def test_row_codec_matches_float64_reference(dtype, seed, d, mag):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((7, d)) * mag
    x[0] = 0.0  # an all-zero row: scale 0, codes 0
    x[1, :4] = [0.5, 1.5, -2.5, 127.0]  # int8 ties at scale 1
    raw = kv_encode(torch.from_numpy(x.astype(np.float32)), dtype)
    assert raw.dtype == torch.uint8 and raw.shape == (7, d + 4)
    codes, scale = _reference_codes(x, dtype)
    got_codes = raw[:, :d].view(dtype).double().numpy()
    np.testing.assert_array_equal(got_codes, codes)
    np.testing.assert_array_equal(raw[:, d:].contiguous().view(torch.float32).numpy(), scale)
    dec = kv_decode(raw, dtype).double().numpy()
    np.testing.assert_allclose(dec, codes * scale.astype(np.float64), rtol=1e-6, atol=0)
    # error bound: half a code step (int8: amax / 254; e4m3: 1/16 relative, or the subnormal step)
    amax = np.abs(x).max(-1, keepdims=True)
    bound = amax / 254 if dtype == torch.int8 else np.maximum(np.abs(x) / 16, amax / 448 * 2.0 ** -10)
    assert (np.abs(dec - x) <= bound * 1.0001 + 1e-30).all()


needs_native = pytest.mark.skipif(native.lib() is None, reason="native kernels unavailable")


@needs_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", QDTYPES)
def test_native_store_is_bit_identical_to_the_torch_codec(isa, dtype):
    so = native.lib(isa)
    rng = np.random.default_rng(3)
    t, h, hkv, d, page, layer = 9, 4, 2, 24, 4, 1
    qkv = torch.from_numpy((rng.standard_normal((t, (h + 2 * hkv) * d)) * rng.uniform(1e-3, 50, (t, 1)))
                           .astype(np.float32))
    qkv[0, h * d:] = 0.0  # zero rows
    blocks = torch.zeros(6, 2, 2, page, hkv, d + 4, dtype=dtype)
    slots = torch.from_numpy(rng.permutation(6 * page)[:t]).to(torch.int64)
    wp, wo = slots // page, slots % page
    pos = torch.arange(t)
    q = torch.empty(t, h, d)
    rc = so.lmx_qkv_rope_store(qkv.data_ptr(), t, qkv.stride(0), h, hkv, d, pos.data_ptr(), 0, 0, 0, 0, 0, 0,
                               ctypes.c_float(1e-6), q.data_ptr(), blocks.data_ptr(), KV_KINDS[dtype],
                               *blocks.stride()[:4], layer, wp.data_ptr(), wo.data_ptr())
    assert rc == 0
    ref = torch.zeros(blocks.shape, dtype=torch.uint8)
    ref[wp, 0, layer, wo] = kv_encode(qkv[:, h * d:(h + hkv) * d].reshape(t, hkv, d), dtype)
    ref[wp, 1, layer, wo] = kv_encode(qkv[:, (h + hkv) * d:].reshape(t, hkv, d), dtype)
    assert torch.equal(blocks.view(torch.uint8), ref)
    assert torch.equal(q, qkv[:, :h * d].reshape(t, h, d))


def _quant_cache(rng, pages, layers, page, hkv, d, dtype):
    x = torch.from_numpy(rng.standard_normal((pages, 2, layers, page, hkv, d)).astype(np.float32))
    x = x * torch.from_numpy(rng.uniform(0.1, 4, (pages, 2, layers, page, hkv, 1)).astype(np.float32))
    return kv_encode(x, dtype).view(dtype)


@needs_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", QDTYPES)
@settings(max_examples=12, deadline=None)
@given(lens=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 9)), min_size=1, max_size=3),
       hkv=st.sampled_from([1, 2]), group=st.sampled_from([1, 3]), window=st.sampled_from([-1, 5]),
       chunk=st.sampled_from([-1, -1, 4]), causal=st.booleans(), d=st.sampled_from([16, 24]),
       seed=st.integers(0, 2**31 - 1))
def test_native_attention_reads_quantised_pages(isa, dtype, lens, hkv, group, window, chunk, causal, d, seed):
    """Ragged batch over randomly placed quantised pages vs a float64 softmax(q k^T * scale) v over the
    decoded cache, with the causal / sliding-window / chunked mask; the torch path agrees too."""
    so = native.lib(isa)
    rng = np.random.default_rng(seed)
    page, layers, layer = 8, 2, 1
    h = hkv * group
    maxp = max((c + n + page - 1) // page for c, n in lens)
    npages = len(lens) * maxp + 3
    blocks = _quant_cache(rng, npages, layers, page, hkv, d, dtype)
    lookup = torch.from_numpy(rng.permutation(npages)[:len(lens) * maxp].reshape(len(lens), maxp).astype(np.int64))
    cl = torch.tensor([c for c, _ in lens], dtype=torch.int64)
    offs = torch.tensor(np.concatenate([[0], np.cumsum([n for _, n in lens])]), dtype=torch.int64)
    t = int(offs[-1])
    q = torch.from_numpy(rng.standard_normal((t, h, d)).astype(np.float32))
    out = torch.empty_like(q)
    rc = so.lmx_paged_attention(q.data_ptr(), t, h, hkv, d, len(lens), offs.data_ptr(), cl.data_ptr(),
                                lookup.data_ptr(), maxp, page, blocks.data_ptr(), KV_KINDS[dtype],
                                *blocks.stride()[:4], layer, ctypes.c_float(0.25), window, chunk, int(causal),
                                out.data_ptr())
    assert rc == 0
    kv = kv_decode(blocks.view(torch.uint8), dtype).double()
    assert_paged_attention(out, q, kv, lens, lookup, offs, page, layer, group, causal, window, chunk=chunk)
    plan = ragged_read_plan(offs, cl, lookup, page)
    torch_out = flash_attention_ragged(q, blocks, *plan, layer=layer, scale=0.25, causal=causal, window=window,
                                       head_dim=d, chunk=chunk)
    assert torch.allclose(torch_out, out, rtol=1e-4, atol=1e-5)


@needs_native
def test_unknown_cache_kind_is_refused():
    so = native.lib()
    q = torch.zeros(1, 1, 16)
    blocks = torch.zeros(1, 2, 1, 4, 1, 16)
    one = torch.zeros(1, dtype=torch.int64)
    offs = torch.tensor([0, 1])
    assert so.lmx_paged_attention(q.data_ptr(), 1, 1, 1, 16, 1, offs.data_ptr(), one.data_ptr(), one.data_ptr(), 1,
                                  4, blocks.data_ptr(), 99, *blocks.stride()[:4], 0, ctypes.c_float(1.0), -1, -1, 1,
                                  q.data_ptr()) == -1


@pytest.mark.parametrize("dtype", QDTYPES)
def test_every_torch_kernel_on_a_quantised_cache(dtype):
    """Each torch kernel that writes or reads the pool, on a quantised cache vs a float32 cache: writes
    store exactly ``kv_encode`` of what the float cache stores; read-modify-writes (RoPE, key norm) are the
    float result re-encoded; attention over the same (decoded) values gives the same output."""
    from max.engine.kernels.decoder import mla_attention_ragged, ragged_attention, store_kv_ragged
    from max.engine.kernels.ragged import (fused_qk_ragged_rope, fused_qkv_ragged_matmul, ragged_rope_tables,
                                           ragged_write_plan, rms_norm_key_cache)

    g = torch.Generator().manual_seed(0)
    pages, page, layers, layer, hkv, h, d = 6, 4, 2, 1, 2, 4, 16
    offs, cl = torch.tensor([0, 3, 5]), torch.tensor([2, 6])
    lookup = torch.tensor([[4, 1, 0], [2, 5, 3]])
    tok_pos, wp, wo = ragged_write_plan(offs, cl, lookup, page)
    t = 5
    qb = torch.zeros(pages, 2, layers, page, hkv, d + 4, dtype=dtype)
    fb = torch.zeros(pages, 2, layers, page, hkv, d)

    def as_float(blocks):
        return kv_decode(blocks.view(torch.uint8), dtype)

    # fill the earlier positions (the cache before this step) with the same decoded values in both
    prev = kv_encode(torch.randn(pages, 2, layers, page, hkv, d, generator=g), dtype)
    qb.view(torch.uint8).copy_(prev)
    fb.copy_(kv_decode(prev, dtype))
    # store_kv_ragged: the quantised rows are exactly kv_encode of the float rows
    k, v = torch.randn(t, hkv, d, generator=g) * 3, torch.randn(t, hkv, d, generator=g)
    store_kv_ragged(k, v, qb, wp, wo, layer=layer)
    store_kv_ragged(k, v, fb, wp, wo, layer=layer)
    assert torch.equal(qb.view(torch.uint8)[wp, :, layer, wo], kv_encode(fb[wp, :, layer, wo], dtype))
    # fused_qkv_ragged_matmul writes the same way
    x, w = torch.randn(t, 32, generator=g), torch.randn((h + 2 * hkv) * d, 32, generator=g) * 0.2
    q1 = fused_qkv_ragged_matmul(x, w, qb, wp, wo, layer=layer, n_heads=h, n_kv_heads=hkv, head_dim=d,
                                 has_bias=False)
    q2 = fused_qkv_ragged_matmul(x, w, fb, wp, wo, layer=layer, n_heads=h, n_kv_heads=hkv, head_dim=d,
                                 has_bias=False)
    assert torch.equal(q1, q2)
    assert torch.equal(qb.view(torch.uint8)[wp, :, layer, wo], kv_encode(fb[wp, :, layer, wo], dtype))
    fb[wp, :, layer, wo] = as_float(qb)[wp, :, layer, wo]  # both caches hold the same values again
    # RoPE on the cached keys: the float result of the decoded keys, re-encoded
    ang = torch.arange(16, dtype=torch.float64)[:, None] * (1.0 / 100.0 ** (torch.arange(d // 2) * 2 / d))
    freqs = torch.stack([ang.cos(), ang.sin()], -1).reshape(16, d).float()
    cos, sin = ragged_rope_tables(freqs, tok_pos)
    qr = torch.randn(t, h, d, generator=g)
    assert torch.equal(fused_qk_ragged_rope(qr, cos, sin, qb, wp, wo, layer=layer, interleaved=False),
                       fused_qk_ragged_rope(qr, cos, sin, fb, wp, wo, layer=layer, interleaved=False))
    assert torch.equal(qb.view(torch.uint8)[wp, 0, layer, wo], kv_encode(fb[wp, 0, layer, wo], dtype))
    fb[wp, :, layer, wo] = as_float(qb)[wp, :, layer, wo]
    # key RMS norm, in place
    gamma = torch.rand(d, generator=g) + 0.5
    rms_norm_key_cache(gamma, qb, wp, wo, layer=layer, eps=1e-6, weight_offset=0.0, cols=d, multiply_before_cast=True)
    rms_norm_key_cache(gamma, fb, wp, wo, layer=layer, eps=1e-6, weight_offset=0.0, cols=d, multiply_before_cast=True)
    assert torch.equal(qb.view(torch.uint8)[wp, 0, layer, wo], kv_encode(fb[wp, 0, layer, wo], dtype))
    fb[wp, :, layer, wo] = as_float(qb)[wp, :, layer, wo]
    assert torch.equal(as_float(qb), fb)
    # attention kernels over the same values: the same outputs
    plan = ragged_read_plan(offs, cl, lookup, page)
    qa = torch.randn(t, h, d, generator=g)
    for causal, window in ((True, -1), (True, 3), (False, -1)):
        assert torch.equal(flash_attention_ragged(qa, qb, *plan, layer=layer, scale=0.25, causal=causal,
                                                  window=window, head_dim=d),
                           flash_attention_ragged(qa, fb, *plan, layer=layer, scale=0.25, causal=causal,
                                                  window=window, head_dim=d))
    assert torch.equal(ragged_attention(qa, qb, *plan, layer=layer, scale=0.25, window=-1, softcap=5.0,
                                        has_sinks=False),
                       ragged_attention(qa, fb, *plan, layer=layer, scale=0.25, window=-1, softcap=5.0,
                                        has_sinks=False))
    # MLA reads one latent row per token (here: the 2 "heads" are its two halves)
    qm = torch.randn(t, 3, 2 * d, generator=g)
    assert torch.equal(mla_attention_ragged(qm, qb[:, :, :, :, :1].contiguous(), *plan, layer=layer, scale=0.1,
                                            latent_dim=d),
                       mla_attention_ragged(qm, fb[:, :, :, :, :1].contiguous(), *plan, layer=layer, scale=0.1,
                                            latent_dim=d))
