"""max.nn.kernels.flash_attention_ragged with ``CHUNKED_CAUSAL_MASK`` (Llama 4's chunked local attention):
``local_window_size`` is the chunk size, a query at position ``p`` sees positions ``(p // c) * c .. p``.
The graph (K/V written by ``ragged_qkv_store``, then the attention, lowered to the native paged kernel on
the CPU, fused with the K/V write into one ``qkv_attention_native`` node) against a float64 numpy reference; a bad chunk size fails at graph build time."""

from __future__ import annotations

import numpy as np
import pytest

from max.driver import CPU, Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, Graph, TensorType
from max.nn import kernels
from max.nn.kernels import MHAMaskVariant
from max.nn.kv_cache import FetchPagedKVCacheCollection, KVCacheParams, PagedKVCacheManager
from test_kv_cache_context import FakeContext

DEV = DeviceRef.CPU()
H, HKV, D = 4, 2, 8
LENGTHS = [11, 6]  # crosses several chunks of 4 (and of 3)
T = sum(LENGTHS)


def _reference(qkv: np.ndarray, chunk: int, scale: float) -> np.ndarray:
    x = qkv.astype(np.float64)
    q = x[:, :H * D].reshape(T, H, D)
    k = x[:, H * D:(H + HKV) * D].reshape(T, HKV, D)
    v = x[:, (H + HKV) * D:].reshape(T, HKV, D)
    out = np.zeros_like(q)
    start = 0
    for n in LENGTHS:
        for i in range(n):
            keys = np.arange(n)
            keep = (keys <= i) & (keys // chunk == i // chunk)
            for h in range(H):
                kk, vv = k[start:start + n][keep, h // (H // HKV)], v[start:start + n][keep, h // (H // HKV)]
                s = kk @ q[start + i, h] * scale
                p = np.exp(s - s.max())
                out[start + i, h] = (p / p.sum()) @ vv
        start += n
    return out


def _graph(kvp, mgr, chunk: int, also_q: bool = False) -> Graph:
    types = [TensorType(DType.float32, [T, (H + 2 * HKV) * D], DEV), TensorType(DType.uint32, [len(LENGTHS) + 1], DEV)]
    with Graph("chunked", input_types=types + list(mgr.input_symbols()[0])) as g:
        qkv, offs, *cache = g.inputs
        qkv, offs = qkv.tensor, offs.tensor
        coll = FetchPagedKVCacheCollection(kvp, 1)(*cache)
        q = kernels.ragged_qkv_store(kvp, qkv, offs, coll, 0, H)
        out = kernels.flash_attention_ragged(kvp, q, offs, coll, 0, MHAMaskVariant.CHUNKED_CAUSAL_MASK, 0.3,
                                             local_window_size=chunk)
        g.output(out, q) if also_q else g.output(out)
    return g


@pytest.mark.parametrize("also_q", [False, True])
@pytest.mark.parametrize("chunk", [3, 4, 64])
def test_chunked_causal_mask_matches_reference(chunk, also_q):
    kvp = KVCacheParams(DType.float32, HKV, D, page_size=4)
    mgr = PagedKVCacheManager(kvp, 4, 32, 1, [CPU()], total_num_pages=16)
    ctxs = [FakeContext(f"r{i}", np.arange(n)) for i, n in enumerate(LENGTHS)]
    for c in ctxs:
        mgr.claim(c.request_id)
    kv_in = mgr.fetch(ctxs)[0]
    model = InferenceSession().load(_graph(kvp, mgr, chunk, also_q))
    ops = {n.op for n in model._prog.nodes}
    if also_q:  # the queries are read elsewhere too: the store and the attention stay two nodes
        assert {"ragged_qkv_store", "flash_attention_ragged_native"} <= ops and "qkv_attention_native" not in ops
    else:
        assert "qkv_attention_native" in ops  # store + native paged attention
    qkv = np.random.default_rng(chunk).standard_normal((T, (H + 2 * HKV) * D)).astype(np.float32)
    offs = np.cumsum([0] + LENGTHS).astype(np.uint32)
    out, *q = model.execute(Buffer.from_numpy(qkv), Buffer.from_numpy(offs), *kv_in)
    np.testing.assert_allclose(out.to_numpy(), _reference(qkv, chunk, 0.3), rtol=1e-4, atol=1e-5)
    if also_q:
        np.testing.assert_array_equal(q[0].to_numpy(), qkv[:, :H * D].reshape(T, H, D))  # no RoPE, no norm


@pytest.mark.parametrize("chunk", [0, -1])
def test_chunked_causal_mask_needs_a_positive_chunk(chunk):
    kvp = KVCacheParams(DType.float32, HKV, D, page_size=4)
    mgr = PagedKVCacheManager(kvp, 4, 32, 1, [CPU()], total_num_pages=16)
    with pytest.raises(ValueError, match="chunk size"):
        _graph(kvp, mgr, chunk)
