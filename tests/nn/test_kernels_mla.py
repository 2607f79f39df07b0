"""max.nn.kernels' MLA entry points on CPU against float64 numpy: flare_mla_decode_ragged (the absorbed
attention the DeepSeek-V2 family runs), and the chunked decompressed prefill (flare_mla_prefill_plan,
flare_mla_decompress_k_cache, flare_mla_prefill_ragged with softmax merging across chunks).
(MAX docs: max/api/python/nn/kernels, flare_mla_*.)"""

from __future__ import annotations

import numpy as np
import pytest

from max.driver import CPU, Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, Graph, TensorType, ops
from max.nn import kernels
from max.nn.kernels import MHAMaskVariant as MV
from max.nn.kernels_decoder import ragged_write_plan, store_kv_ragged
from max.nn.kv_cache import FetchPagedKVCacheCollection, KVCacheParams, PagedKVCacheManager
from test_kv_cache_context import FakeContext

DEV = DeviceRef.CPU()
LAT, RD, H, NOPE, VD = 6, 2, 3, 4, 5
WIDTH = LAT + RD
LENGTHS = [3, 6]
T = sum(LENGTHS)


def _setup():
    kvp = KVCacheParams(DType.float32, 1, WIDTH // 2, page_size=4)
    mgr = PagedKVCacheManager(kvp, 4, 32, 1, [CPU()], total_num_pages=16)
    ctxs = [FakeContext(f"r{i}", np.arange(n)) for i, n in enumerate(LENGTHS)]
    for c in ctxs:
        mgr.claim(c.request_id)
    return kvp, mgr, mgr.fetch(ctxs)[0]


def _write_rows(kvp, rows, offs, coll):
    _, page, off = ragged_write_plan(offs, coll)
    half = WIDTH // 2
    store_kv_ragged(kvp, ops.reshape(rows[:, :half], [-1, 1, half]), ops.reshape(rows[:, half:], [-1, 1, half]),
                    coll, page, off, 0)


def _softmax_attend(scores, allowed, values):
    s = np.where(allowed, scores, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ values


def test_flare_mla_decode_ragged():
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((T, WIDTH)).astype(np.float32)
    q = rng.standard_normal((T, H, WIDTH)).astype(np.float32)
    kvp, mgr, kv_in = _setup()
    types = [TensorType(DType.float32, rows.shape, DEV), TensorType(DType.float32, q.shape, DEV),
             TensorType(DType.uint32, [3], DEV)]
    with Graph("mla_dec", input_types=types + list(mgr.input_symbols()[0])) as g:
        rv, qv, ov, *cache = g.inputs
        coll = FetchPagedKVCacheCollection(kvp, 1)(*cache)
        _write_rows(kvp, rv.tensor, ov.tensor, coll)
        g.output(kernels.flare_mla_decode_ragged(kvp, qv.tensor, ov.tensor, coll, 0, MV.CAUSAL_MASK, 0.3,
                                                 qk_rope_dim=RD))
        with pytest.raises(NotImplementedError, match="CAUSAL_MASK"):
            kernels.flare_mla_decode_ragged(kvp, qv.tensor, ov.tensor, coll, 0, MV.NULL_MASK, 0.3, qk_rope_dim=RD)
    offs = np.cumsum([0] + LENGTHS).astype(np.uint32)
    (out,) = InferenceSession().load(g).execute(*[Buffer.from_numpy(a) for a in (rows, q, offs)], *kv_in)
    assert out.to_numpy().shape == (T, H, LAT)
    for s, n in zip(offs[:-1], LENGTHS):
        r = rows[s:s + n].astype(np.float64)
        allowed = np.tril(np.ones((n, n), bool))
        for h in range(H):
            ref = _softmax_attend(q[s:s + n, h].astype(np.float64) @ r.T * 0.3, allowed, r[:, :LAT])
            np.testing.assert_allclose(out.to_numpy()[s:s + n, h], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("buffer_size", [4, 16])
def test_chunked_mla_prefill_matches_full_attention(buffer_size):
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((T, WIDTH)).astype(np.float32)
    q = rng.standard_normal((T, H, NOPE + RD)).astype(np.float32)
    wk = rng.standard_normal((H * NOPE, LAT)).astype(np.float32) / 2
    wv = rng.standard_normal((H * VD, LAT)).astype(np.float32) / 2
    kvp, mgr, kv_in = _setup()
    chunks = 3
    types = [TensorType(DType.float32, a.shape, DEV) for a in (rows, q, wk, wv)] + [TensorType(DType.uint32, [3], DEV)]
    with Graph("mla_pre", input_types=types + list(mgr.input_symbols()[0])) as g:
        rv, qv, wkv, wvv, ov, *cache = g.inputs
        coll = FetchPagedKVCacheCollection(kvp, 1)(*cache)
        _write_rows(kvp, rv.tensor, ov.tensor, coll)
        bro, co, lens = kernels.flare_mla_prefill_plan(kvp, ov.tensor, coll, 0, buffer_size, max_chunks=chunks)
        out = info = None
        for c in range(chunks):
            k = kernels.flare_mla_decompress_k_cache(kvp, bro[c], co[c], lens[c], wkv.tensor, coll, 0, buffer_size)
            v = kernels.flare_mla_decompress_k_cache(kvp, bro[c], co[c], lens[c], wvv.tensor, coll, 0, buffer_size)
            out, info = kernels.flare_mla_prefill_ragged(
                kvp, qv.tensor, ops.reshape(k, [buffer_size, H, NOPE]), ops.reshape(v, [buffer_size, H, VD]),
                ov.tensor, bro[c], co[c], coll, 0, MV.CAUSAL_MASK, 0.25, qk_rope_dim=RD, prev_output=out,
                prev_softmax_info=info)
        g.output(out, bro, co, lens)
    offs = np.cumsum([0] + LENGTHS).astype(np.uint32)
    res = InferenceSession().load(g).execute(*[Buffer.from_numpy(a) for a in (rows, q, wk, wv, offs)], *kv_in)
    out, bro, co, lens = (r.to_numpy() for r in res)
    # the plan: requests' positions one after another, cut every buffer_size rows
    starts = np.cumsum([0] + LENGTHS)
    for c in range(chunks):
        c0 = c * buffer_size
        np.testing.assert_array_equal(bro[c], np.clip(starts - c0, 0, buffer_size))
        np.testing.assert_array_equal(co[c], np.minimum(np.clip(c0 - starts[:-1], 0, None), LENGTHS))
        assert lens[c] == (min(T - c0, buffer_size) if T > c0 else -1)
    for s, n in zip(offs[:-1], LENGTHS):
        lat = rows[s:s + n, :LAT].astype(np.float64)
        k_rope = rows[s:s + n, LAT:].astype(np.float64)
        allowed = np.tril(np.ones((n, n), bool))
        for h in range(H):
            keys = np.concatenate([lat @ wk[h * NOPE:(h + 1) * NOPE].T.astype(np.float64), k_rope], axis=1)
            vals = lat @ wv[h * VD:(h + 1) * VD].T.astype(np.float64)
            ref = _softmax_attend(q[s:s + n, h].astype(np.float64) @ keys.T * 0.25, allowed, vals)
            np.testing.assert_allclose(out[s:s + n, h], ref, rtol=1e-4, atol=1e-5)
