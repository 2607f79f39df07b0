"""max.nn.kernels_decoder (K/V rows into the paged cache, RoPE on projected q/k with partial rotation,
attention with sinks / soft-capping / sliding window) against float64 numpy references on ragged batches
that cross page boundaries."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from max.driver import CPU, Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, Graph, TensorType
from max.nn.kernels_decoder import ragged_attention, ragged_rope, ragged_rope_tables, ragged_write_plan, store_kv_ragged
from max.nn.kv_cache import FetchPagedKVCacheCollection, KVCacheParams, PagedKVCacheManager
from test_kv_cache_context import FakeContext

H, HKV, D, PAGE = 4, 2, 8, 4


def _run(lengths, *, window=None, sinks=None, softcap=None, rot=D, interleaved=False, seed=0, groups=None,
         chunk=None):
    rng = np.random.default_rng(seed)
    T = sum(lengths)
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    k = rng.standard_normal((T, HKV, D)).astype(np.float32)
    v = rng.standard_normal((T, HKV, D)).astype(np.float32)
    ang = np.outer(np.arange(64), 1.0 / 10000 ** (np.arange(0, rot, 2) / rot))
    freqs = np.stack([np.cos(ang), np.sin(ang)], -1).reshape(64, rot).astype(np.float32)
    kvp = KVCacheParams(DType.float32, HKV, D, page_size=PAGE)
    mgr = PagedKVCacheManager(kvp, 4, 64, 1, [CPU()], total_num_pages=32)
    ctxs = [FakeContext(f"r{i}", np.arange(n)) for i, n in enumerate(lengths)]
    for c in ctxs:
        mgr.claim(c.request_id)
    kv_in = mgr.fetch(ctxs)[0]
    dev = DeviceRef.CPU()
    types = [TensorType(DType.float32, [T, H, D], dev), TensorType(DType.float32, [T, HKV, D], dev),
             TensorType(DType.float32, [T, HKV, D], dev), TensorType(DType.uint32, [len(lengths) + 1], dev)]
    types += [TensorType(DType.int64, [T], dev)] if groups is not None else []
    with Graph("attn", input_types=types + list(mgr.input_symbols()[0])) as g:
        qv, kv_, vv, offs, *cache = g.inputs
        gv = None
        if groups is not None:
            gv, *cache = cache
            gv = gv.tensor
        coll = FetchPagedKVCacheCollection(kvp, 1)(*cache)
        pos, page, off = ragged_write_plan(offs.tensor, coll)
        cos, sin = ragged_rope_tables(freqs, pos)
        qr = ragged_rope(qv.tensor, cos, sin, interleaved)
        kr = ragged_rope(kv_.tensor, cos, sin, interleaved)
        store_kv_ragged(kvp, kr, vv.tensor, coll, page, off, 0)
        g.output(ragged_attention(kvp, qr, offs.tensor, coll, 0, 0.3, window, sinks=sinks, softcap=softcap,
                                  groups=gv, chunk=chunk), qr)
    offsets = np.cumsum([0] + list(lengths)).astype(np.uint32)
    arrays = (q, k, v, offsets) + ((np.asarray(groups, np.int64),) if groups is not None else ())
    out, qrot = InferenceSession().load(g).execute(*[Buffer.from_numpy(a) for a in arrays], *kv_in)
    return (q, k, v, freqs, lengths), out.to_numpy(), qrot.to_numpy()


def _rope_ref(x, freqs, pos, rot, interleaved):
    x = x.astype(np.float64).copy()
    c, s = freqs[pos, 0::2][:, None], freqs[pos, 1::2][:, None]
    if interleaved:
        a, b = x[..., 0:rot:2].copy(), x[..., 1:rot:2].copy()
        x[..., 0:rot:2], x[..., 1:rot:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., : rot // 2].copy(), x[..., rot // 2: rot].copy()
        x[..., : rot // 2], x[..., rot // 2: rot] = a * c - b * s, a * s + b * c
    return x


def _attn_ref(inputs, window, sinks, softcap, rot, interleaved, groups=None, chunk=None):
    q, k, v, freqs, lengths = inputs
    out = []
    start = 0
    for n in lengths:
        grp = np.full(n, -1) if groups is None else np.asarray(groups[start:start + n])
        pos = np.arange(n)
        qq = _rope_ref(q[start:start + n], freqs, pos, rot, interleaved)
        kk = _rope_ref(k[start:start + n], freqs, pos, rot, interleaved).repeat(H // HKV, axis=1)
        vv = v[start:start + n].astype(np.float64).repeat(H // HKV, axis=1)
        s = np.einsum("qhd,khd->hqk", qq, kk) * 0.3
        if softcap:
            s = np.tanh(s / softcap) * softcap
        allowed = (pos[None, :] <= pos[:, None]) | ((grp[:, None] == grp[None, :]) & (grp[:, None] >= 0))
        if window:
            allowed &= pos[None, :] > pos[:, None] - window
        if chunk:
            allowed &= pos[None, :] // chunk == pos[:, None] // chunk
        s = np.where(allowed[None], s, -np.inf)
        if sinks is not None:
            s = np.concatenate([s, np.broadcast_to(np.asarray(sinks, np.float64)[:, None, None], (H, n, 1))], -1)
        p = np.exp(s - s.max(-1, keepdims=True))
        p = p / p.sum(-1, keepdims=True)
        if sinks is not None:
            p = p[..., :-1]
        out.append(np.einsum("hqk,khd->qhd", p, vv))
        start += n
    return np.concatenate(out)


@pytest.mark.parametrize("window,sinks,softcap", [(None, [0.5, -1.0, 2.0, 0.0], None), (3, None, 1.5),
                                                  (5, [1.0, 1.0, -2.0, 0.3], 4.0)])
@pytest.mark.parametrize("rot,interleaved", [(D, False), (D // 2, False), (D, True)])
def test_attention_with_sinks_softcap_window_and_partial_rope(window, sinks, softcap, rot, interleaved):
    sk = None if sinks is None else np.asarray(sinks, np.float32)
    inputs, out, qrot = _run([7, 1, 10], window=window, sinks=sk, softcap=softcap, rot=rot, interleaved=interleaved)
    q, _, _, freqs, lengths = inputs
    pos = np.concatenate([np.arange(n) for n in lengths])
    np.testing.assert_allclose(qrot, _rope_ref(q, freqs, pos, rot, interleaved), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out, _attn_ref(inputs, window, sinks, softcap, rot, interleaved), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window,sinks", [(None, None), (3, None), (None, [0.5, -1.0, 2.0, 0.0])])
@pytest.mark.parametrize("groups", [
    [-1, 0, 0, 0, -1, 1, 1, -1] + [-1] + [-1, 4, 4, 4, 4, 4, 4, -1, -1],  # blocks (one wider than the window)
    [-1] * 18,  # no block: the plain causal kernel
])
def test_attention_with_bidirectional_blocks(window, sinks, groups):
    """Tokens of one block attend to each other both ways (Gemma 3's image tokens); the window still applies."""
    sk = None if sinks is None else np.asarray(sinks, np.float32)
    inputs, out, _ = _run([8, 1, 9], window=window, sinks=sk, groups=groups)
    np.testing.assert_allclose(out, _attn_ref(inputs, window, sinks, None, D, False, groups), rtol=1e-4, atol=1e-4)


@settings(max_examples=12, deadline=None)
@given(st.lists(st.integers(1, 14), min_size=1, max_size=3), st.integers(1, 6), st.booleans(), st.integers(0, 99))
def test_chunked_local_attention(lengths, chunk, softcap, seed):
    """Llama 4's chunked local attention: a query sees only the keys of its own chunk of ``chunk`` positions."""
    inputs, out, _ = _run(lengths, chunk=chunk, softcap=2.0 if softcap else None, seed=seed)
    want = _attn_ref(inputs, None, None, 2.0 if softcap else None, D, False, chunk=chunk)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_bad_arguments_name_the_op():
    kvp = KVCacheParams(DType.float32, HKV, D, page_size=PAGE)
    mgr = PagedKVCacheManager(kvp, 2, 16, 1, [CPU()], total_num_pages=8)
    dev = DeviceRef.CPU()
    with Graph("bad", input_types=[TensorType(DType.float32, [3, H, D], dev), TensorType(DType.uint32, [2], dev),
                                   *mgr.input_symbols()[0]]) as g:
        q, offs, *cache = g.inputs
        coll = FetchPagedKVCacheCollection(kvp, 1)(*cache)
        with pytest.raises(ValueError, match="ragged_attention: sinks must be"):
            ragged_attention(kvp, q, offs, coll, 0, 1.0, sinks=np.zeros(3, np.float32))
        with pytest.raises(ValueError, match="ragged_attention: chunk must be > 0"):
            ragged_attention(kvp, q, offs, coll, 0, 1.0, chunk=-2)
        with pytest.raises(ValueError, match="ragged_attention: groups must be an int64"):
            ragged_attention(kvp, q, offs, coll, 0, 1.0, groups=np.zeros(3, np.float32))
        with pytest.raises(ValueError, match="store_kv_ragged: k must be"):
            store_kv_ragged(kvp, q, q, coll, offs, offs, 0)
        with pytest.raises(ValueError, match="ragged_rope: rope_dim"):
            ragged_rope(q, np.zeros((3, 1, 5), np.float32), np.zeros((3, 1, 5), np.float32))
