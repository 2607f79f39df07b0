"""max.nn.kernels' attention without a cache (flash_attention_gpu / flash_attention_ragged_gpu), cross
attention over the paged cache, K/V projections into the cache (matmul_k_cache_ragged,
matmul_kv_cache_ragged), kv_cache_ragged_radd and the GGUF-quantised QKV projection, against float64
numpy references on CPU.  (MAX docs: max/api/python/nn/kernels.)"""

from __future__ import annotations

import numpy as np
import pytest

from max.driver import CPU, Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, Graph, TensorType
from max.nn import kernels
from max.nn.kernels import MHAMaskVariant as MV
from max.nn.kv_cache import FetchPagedKVCacheCollection, KVCacheParams, PagedKVCacheManager
from test_kv_cache_context import FakeContext

DEV = DeviceRef.CPU()
H, HKV, D, PAGE = 4, 2, 8, 4


def _ref_attn(q, k, v, allowed, scale):
    """q [Sq, H, D], k/v [Sk, Hkv, D], allowed [Sq, Sk] -> [Sq, H, D] (float64; all-masked rows zero)."""
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1).astype(np.float64), np.repeat(v, rep, axis=1).astype(np.float64)
    s = np.einsum("qhd,khd->hqk", q.astype(np.float64), k) * scale
    s = np.where(allowed[None], s, -np.inf)
    m = np.max(s, -1, keepdims=True)
    p = np.where(np.isfinite(m), np.exp(s - np.where(np.isfinite(m), m, 0)), 0)
    p = p / np.where(p.sum(-1, keepdims=True) > 0, p.sum(-1, keepdims=True), 1)
    return np.einsum("hqk,khd->qhd", p, v)


def _mask(n_q, n_k, causal, window, q_shift=0):
    i = np.arange(n_q)[:, None] + q_shift
    j = np.arange(n_k)[None, :]
    ok = np.ones((n_q, n_k), bool)
    if causal:
        ok &= j <= i
    if window > 0:
        ok &= j > i - window
    return ok


@pytest.mark.parametrize("variant,window", [(MV.NULL_MASK, -1), (MV.CAUSAL_MASK, -1),
                                            (MV.SLIDING_WINDOW_CAUSAL_MASK, 2)])
@pytest.mark.parametrize("with_valid", [False, True])
def test_flash_attention_gpu_padded(variant, window, with_valid):
    rng = np.random.default_rng(0)
    B, S = 2, 5
    q = rng.standard_normal((B, S, H, D)).astype(np.float32)
    k = rng.standard_normal((B, S, HKV, D)).astype(np.float32)
    v = rng.standard_normal((B, S, HKV, D)).astype(np.float32)
    lens = np.array([5, 3], np.uint32)
    types = [TensorType(DType.float32, a.shape, DEV) for a in (q, k, v)] + [TensorType(DType.uint32, [B], DEV)]
    with Graph("fa", input_types=types) as g:
        qv, kv, vv, lv = (x.tensor for x in g.inputs)
        g.output(kernels.flash_attention_gpu(qv, kv, vv, variant, 0.4, window, valid_length=lv if with_valid else None))
    (out,) = InferenceSession().load(g).execute(*[Buffer.from_numpy(a) for a in (q, k, v, lens)])
    causal = variant is not MV.NULL_MASK
    for b in range(B):
        n = int(lens[b]) if with_valid else S
        ok = _mask(S, S, causal, window if variant is MV.SLIDING_WINDOW_CAUSAL_MASK else -1)
        ok[:, n:] = False
        ref = _ref_attn(q[b], k[b], v[b], ok, 0.4)
        ref[n:] = 0
        np.testing.assert_allclose(out.to_numpy()[b], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", [MV.NULL_MASK, MV.CAUSAL_MASK])
def test_flash_attention_ragged_gpu(variant):
    rng = np.random.default_rng(1)
    lengths = [3, 1, 6]
    T = sum(lengths)
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    k = rng.standard_normal((T, HKV, D)).astype(np.float32)
    v = rng.standard_normal((T, HKV, D)).astype(np.float32)
    offs = np.cumsum([0] + lengths).astype(np.uint32)
    types = [TensorType(DType.float32, a.shape, DEV) for a in (q, k, v)] + [TensorType(DType.uint32, [4], DEV)]
    with Graph("far", input_types=types) as g:
        qv, kv, vv, ov = (x.tensor for x in g.inputs)
        g.output(kernels.flash_attention_ragged_gpu(qv, kv, vv, ov, max(lengths), variant, 0.3))
    (out,) = InferenceSession().load(g).execute(*[Buffer.from_numpy(a) for a in (q, k, v, offs)])
    for s, n in zip(offs[:-1], lengths):
        ref = _ref_attn(q[s:s + n], k[s:s + n], v[s:s + n], _mask(n, n, variant is MV.CAUSAL_MASK, -1), 0.3)
        np.testing.assert_allclose(out.to_numpy()[s:s + n], ref, rtol=1e-5, atol=1e-5)


def _cache(lengths, layers=1):
    kvp = KVCacheParams(DType.float32, HKV, D, page_size=PAGE)
    mgr = PagedKVCacheManager(kvp, 4, 64, layers, [CPU()], total_num_pages=32)
    ctxs = [FakeContext(f"r{i}", np.arange(n)) for i, n in enumerate(lengths)]
    for c in ctxs:
        mgr.claim(c.request_id)
    return kvp, mgr, mgr.fetch(ctxs)[0]


def _slots(kv_in, lengths):
    lut = kv_in[2].to_numpy()
    return [[(lut[b, i // PAGE], i % PAGE) for i in range(n)] for b, n in enumerate(lengths)]


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("variant", [MV.NULL_MASK, MV.CAUSAL_MASK])
def test_kv_projection_then_cross_attention(variant, native):
    """matmul_kv_cache_ragged writes an encoder's K/V; cross_attention_ragged reads kv_len of them per request
    (with the native kernels and a null mask: read in place by cross_attention_ragged_native; one request has
    fewer keys than queries)."""
    from max.engine import backend, native as native_lib

    if native and native_lib.lib() is None:
        pytest.skip("no native kernels (no C compiler)")
    rng = np.random.default_rng(2)
    kv_lengths, q_lengths, hidden = [5, 2], [2, 3], 16
    Tk, Tq = sum(kv_lengths), sum(q_lengths)
    enc = rng.standard_normal((Tk, hidden)).astype(np.float32)
    w = rng.standard_normal((2 * HKV * D, hidden)).astype(np.float32) / 4
    q = rng.standard_normal((Tq, H * D)).astype(np.float32)
    kvp, mgr, kv_in = _cache(kv_lengths)
    types = [TensorType(DType.float32, a.shape, DEV) for a in (enc, w, q)]
    types += [TensorType(DType.uint32, [3], DEV)] * 2
    with Graph("xattn", input_types=types + list(mgr.input_symbols()[0])) as g:
        ev, wv, qv, kvo, qo, *cache = g.inputs
        coll = FetchPagedKVCacheCollection(kvp, 1)(*cache)
        kernels.matmul_kv_cache_ragged(kvp, ev.tensor, kvo.tensor, wv.tensor, coll, 0)
        g.output(kernels.cross_attention_ragged(kvp, qv.tensor, qo.tensor, coll, 0, variant, kvo.tensor,
                                                max(q_lengths), 0.35))
    kvo_np, qo_np = (np.cumsum([0] + x).astype(np.uint32) for x in (kv_lengths, q_lengths))
    try:
        backend.use(backend.BackendPolicy(native=native, isa=backend.current().isa if native else None))
        model = InferenceSession().load(g)
    finally:
        backend.use(None)
    ops_run = {n.op for n in model._prog.nodes}
    assert ("cross_attention_ragged_native" in ops_run) == (native and variant is MV.NULL_MASK)
    (out,) = model.execute(*[Buffer.from_numpy(a) for a in (enc, w, q, kvo_np, qo_np)], *kv_in)
    proj = enc.astype(np.float64) @ w.astype(np.float64).T
    assert out.to_numpy().shape == (Tq, H * D)
    for b in range(2):
        ks, n_k = kvo_np[b], kv_lengths[b]
        kk = proj[ks:ks + n_k, :HKV * D].reshape(n_k, HKV, D)
        vv = proj[ks:ks + n_k, HKV * D:].reshape(n_k, HKV, D)
        qs, n_q = qo_np[b], q_lengths[b]
        ref = _ref_attn(q[qs:qs + n_q].reshape(n_q, H, D), kk, vv, _mask(n_q, n_k, variant is MV.CAUSAL_MASK, -1),
                        0.35)
        np.testing.assert_allclose(out.to_numpy()[qs:qs + n_q].reshape(n_q, H, D), ref, rtol=1e-4, atol=1e-5)


def test_k_only_projection_and_radd():
    """matmul_k_cache_ragged fills only K; kv_cache_ragged_radd adds into K and V of the last requests."""
    rng = np.random.default_rng(3)
    lengths, hidden = [2, 3, 2], 8
    T = sum(lengths)
    x = rng.standard_normal((T, hidden)).astype(np.float32)
    wk = rng.standard_normal((HKV * D, hidden)).astype(np.float32)
    a = rng.standard_normal((lengths[1] + lengths[2], 2 * HKV * D)).astype(np.float32)
    kvp, mgr, kv_in = _cache(lengths)
    types = [TensorType(DType.float32, t.shape, DEV) for t in (x, wk, a)] + [TensorType(DType.uint32, [4], DEV)]
    with Graph("kradd", input_types=types + list(mgr.input_symbols()[0])) as g:
        xv, wv, av, ov, *cache = g.inputs
        coll = FetchPagedKVCacheCollection(kvp, 1)(*cache)
        kernels.matmul_k_cache_ragged(kvp, xv.tensor, ov.tensor, wv.tensor, coll, 0)
        kernels.kv_cache_ragged_radd(kvp, av.tensor, coll, ov.tensor, 1, 0)
        g.output(xv.tensor)
    offs = np.cumsum([0] + lengths).astype(np.uint32)
    before = kv_in[0].to_numpy().copy()
    InferenceSession().load(g).execute(*[Buffer.from_numpy(t) for t in (x, wk, a, offs)], *kv_in)
    blocks = kv_in[0].to_numpy()
    k_ref = (x.astype(np.float64) @ wk.astype(np.float64).T).reshape(T, HKV, D)
    t = 0
    for b, slots in enumerate(_slots(kv_in, lengths)):
        for page, off in slots:
            add = a[t - lengths[0]].reshape(2, HKV, D) if b >= 1 else np.zeros((2, HKV, D))
            np.testing.assert_allclose(blocks[page, 0, 0, off], k_ref[t] + add[0], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(blocks[page, 1, 0, off], before[page, 1, 0, off] + add[1], rtol=1e-6,
                                       atol=1e-6)  # V: only the added part
            t += 1


def test_unfused_qkv_gguf_quantized(monkeypatch):
    gguf = pytest.importorskip("gguf")
    from gguf import quants

    from max.graph.quantization import QuantizationEncoding as Q

    monkeypatch.setenv("LIBREMAX_QMATMUL", "exact")
    rng = np.random.default_rng(4)
    lengths, hidden = [3, 2], 64
    T = sum(lengths)
    x = rng.standard_normal((T, hidden)).astype(np.float32)
    ws = [rng.standard_normal((rows, hidden)).astype(np.float32) for rows in (H * D, HKV * D, HKV * D)]
    kinds = [(Q.Q8_0, gguf.GGMLQuantizationType.Q8_0), (Q.Q4_0, gguf.GGMLQuantizationType.Q4_0),
             (Q.Q8_0, gguf.GGMLQuantizationType.Q8_0)]
    qws = [quants.quantize(w, t) for w, (_, t) in zip(ws, kinds)]
    deq = [quants.dequantize(qw, t).astype(np.float64) for qw, (_, t) in zip(qws, kinds)]
    kvp, mgr, kv_in = _cache(lengths)
    types = [TensorType(DType.float32, x.shape, DEV)] + [TensorType(DType.uint8, qw.shape, DEV) for qw in qws]
    types += [TensorType(DType.uint32, [3], DEV)]
    with Graph("gguf_qkv", input_types=types + list(mgr.input_symbols()[0])) as g:
        xv, qv, kv, vv, ov, *cache = g.inputs
        coll = FetchPagedKVCacheCollection(kvp, 1)(*cache)
        g.output(kernels.unfused_qkv_ragged_matmul_gguf_quantized(
            kvp, xv.tensor, ov.tensor, H, qv.tensor, kv.tensor, vv.tensor, kinds[0][0], kinds[1][0], kinds[2][0],
            coll, 0))
    offs = np.cumsum([0] + lengths).astype(np.uint32)
    (q,) = InferenceSession().load(g).execute(*[Buffer.from_numpy(t) for t in [x] + qws + [offs]], *kv_in)
    xd = x.astype(np.float64)
    np.testing.assert_allclose(q.to_numpy(), xd @ deq[0].T, rtol=1e-4, atol=1e-4)
    blocks = kv_in[0].to_numpy()
    t = 0
    for slots in _slots(kv_in, lengths):
        for page, off in slots:
            np.testing.assert_allclose(blocks[page, 0, 0, off].ravel(), xd[t] @ deq[1].T, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(blocks[page, 1, 0, off].ravel(), xd[t] @ deq[2].T, rtol=1e-4, atol=1e-4)
            t += 1
    with Graph("bad", input_types=types + list(mgr.input_symbols()[0])) as g:
        xv, qv, kv, vv, ov, *cache = g.inputs
        coll = FetchPagedKVCacheCollection(kvp, 1)(*cache)
        with pytest.raises(ValueError, match="q_weight projects to"):
            kernels.unfused_qkv_ragged_matmul_gguf_quantized(kvp, xv.tensor, ov.tensor, H + 1, qv.tensor, kv.tensor,
                                                             vv.tensor, Q.Q8_0, Q.Q4_0, Q.Q8_0, coll, 0)


@pytest.mark.parametrize("first", ["max.nn.kernels_decoder", "max.nn.kernels_attention", "max.nn.kernels_mla"])
def test_family_modules_import_in_any_order(first):
    """max.nn.kernels reaches its family modules' entry points lazily: importing any of them first works."""
    import subprocess
    import sys

    code = (f"import {first}; import max.nn.kernels as k; "
            "print(k.cross_attention_ragged.__module__, k.flare_mla_decode_ragged.__module__, k.sgmv_kernel.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["max.nn.kernels_attention", "max.nn.kernels_mla", "max.nn.lora"]
