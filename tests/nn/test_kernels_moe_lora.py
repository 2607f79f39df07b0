"""max.nn.kernels' MoE entry points (moe_create_indices, grouped_matmul_ragged: the kernels the MoE
layer runs) and SGMV LoRA entry points (sgmv_kernel, sgmv_lora_kernel, sgmv_qkv_lora_kernel: built
on max.nn.lora's lora_delta_add), against float64 numpy references.  (MAX docs:
max/api/python/nn/kernels.)"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from max.driver import Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, Graph, TensorType
from max.nn import kernels

DEV = DeviceRef.CPU()


def _run(types, build, *arrays, extra=()):
    with Graph("k", input_types=types + list(extra)) as g:
        outs = build(*[v.tensor if hasattr(v, "tensor") else v for v in g.inputs])
        g.output(*(outs if isinstance(outs, (tuple, list)) else (outs,)))
    return InferenceSession().load(g).execute(*[Buffer.from_numpy(a) for a in arrays])


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 7), st.integers(1, 3), st.integers(3, 6), st.integers(0, 2**31 - 1))
def test_moe_create_indices_and_grouped_matmul(T, k, E, seed):
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32)
    x = rng.standard_normal((T * k, 5)).astype(np.float32)
    w = rng.standard_normal((E, 3, 5)).astype(np.float32)

    def build(iv, xv, wv):
        order, starts, restore, eids, stats = kernels.moe_create_indices(iv, E)
        return order, starts, restore, eids, stats, kernels.grouped_matmul_ragged(xv, wv, starts, eids, stats)

    res = [r.to_numpy() for r in _run([TensorType(DType.int32, [T, k], DEV), TensorType(DType.float32, x.shape, DEV),
                                       TensorType(DType.float32, w.shape, DEV)], build, ids, x, w)]
    order, starts, restore, eids, stats, y = res
    flat = ids.reshape(-1)
    ref_order = np.argsort(flat, kind="stable")
    np.testing.assert_array_equal(order, ref_order)
    np.testing.assert_array_equal(order[restore.astype(np.int64)], np.arange(T * k))
    active = np.unique(flat)
    counts = np.bincount(flat, minlength=E)
    assert stats.tolist() == [counts.max(), len(active)]
    np.testing.assert_array_equal(eids[:len(active)], active)
    assert (eids[len(active):] == -1).all()
    ref_starts = np.concatenate([[0], np.cumsum(counts[active])])
    np.testing.assert_array_equal(starts[:len(active) + 1], ref_starts)
    ref_y = np.zeros((T * k, 3))
    for i, e in enumerate(active):
        a, b = ref_starts[i], ref_starts[i + 1]
        ref_y[a:b] = x[a:b].astype(np.float64) @ w[e].astype(np.float64).T
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-5)


def test_grouped_matmul_rejects_mismatched_weight():
    with Graph("bad", input_types=[TensorType(DType.float32, [4, 5], DEV), TensorType(DType.float32, [2, 3, 6], DEV),
                                   TensorType(DType.uint32, [3], DEV), TensorType(DType.int32, [2], DEV),
                                   TensorType(DType.uint32, [2], DEV)]) as g:
        with pytest.raises(ValueError, match="weight \\[experts, out, in\\]"):
            kernels.grouped_matmul_ragged(*(v.tensor for v in g.inputs))


# groups: rows 0-2 adapter 1 (rank 2), rows 3-4 no adapter (-1), rows 5-7 adapter 0 (rank 3); row 8 in no group
OFFS = np.array([0, 3, 5, 8], np.uint32)
IDS = np.array([1, -1, 0], np.int32)
RANKS = np.array([2, 0, 3], np.int32)
L, R, DIN, DOUT, ROWS = 2, 3, 6, 4, 9


def _row_slots():
    slot, rank = np.full(ROWS, -1), np.zeros(ROWS, int)
    for g in range(3):
        slot[OFFS[g]:OFFS[g + 1]], rank[OFFS[g]:OFFS[g + 1]] = IDS[g], RANKS[g]
    return slot, rank


def _lora_ref(x, a, b):
    slot, rank = _row_slots()
    out = np.zeros((ROWS, b.shape[1]))
    for t in range(ROWS):
        if slot[t] >= 0:
            r = rank[t]
            out[t] = x[t].astype(np.float64) @ a[slot[t], :r].T.astype(np.float64) @ b[slot[t], :, :r].T
    return out


def _group_types():
    return [TensorType(DType.uint32, [4], DEV), TensorType(DType.int32, [3], DEV), TensorType(DType.int32, [3], DEV)]


def test_sgmv_lora_kernel_shrink_then_expand():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((ROWS, DIN)).astype(np.float32)
    a = rng.standard_normal((L, R, DIN)).astype(np.float32)
    b = rng.standard_normal((L, DOUT, R)).astype(np.float32)
    types = [TensorType(DType.float32, t.shape, DEV) for t in (x, a, b)] + _group_types()
    (y,) = _run(types, lambda xv, av, bv, ov, iv, rv: kernels.sgmv_lora_kernel(xv, av, bv, iv, rv, ov, 3),
                x, a, b, OFFS, IDS, RANKS)
    np.testing.assert_allclose(y.to_numpy(), _lora_ref(x, a, b), rtol=1e-5, atol=1e-5)


def test_sgmv_kernel_single_product_with_bias():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((ROWS, DIN)).astype(np.float32)
    w = rng.standard_normal((L, DOUT, DIN)).astype(np.float32)
    bias = rng.standard_normal((L, DOUT)).astype(np.float32)
    types = [TensorType(DType.float32, t.shape, DEV) for t in (x, w, bias)] + _group_types()
    (y,) = _run(types, lambda xv, wv, bv, ov, iv, rv: kernels.sgmv_kernel(xv, wv, iv, rv, ov, 3, bias=bv),
                x, w, bias, OFFS, IDS, RANKS)
    slot, _ = _row_slots()
    ref = np.zeros((ROWS, DOUT))
    for t in range(ROWS):
        if slot[t] >= 0:
            ref[t] = x[t].astype(np.float64) @ w[slot[t]].T.astype(np.float64) + bias[slot[t]]
    np.testing.assert_allclose(y.to_numpy(), ref, rtol=1e-5, atol=1e-5)


def test_sgmv_qkv_lora_kernel_returns_q_and_adds_kv_into_cache():
    from max.driver import CPU
    from max.nn.kv_cache import FetchPagedKVCacheCollection, KVCacheParams, PagedKVCacheManager
    from test_kv_cache_context import FakeContext

    HKV, D, qd = 1, 4, 8
    kvd = HKV * D
    rng = np.random.default_rng(7)
    x = rng.standard_normal((ROWS, DIN)).astype(np.float32)
    a = rng.standard_normal((L, 3 * R, DIN)).astype(np.float32)
    b = rng.standard_normal((L, qd + 2 * kvd, R)).astype(np.float32)
    lengths = [4, 5]
    kvp = KVCacheParams(DType.float32, HKV, D, page_size=4)
    mgr = PagedKVCacheManager(kvp, 4, 32, 1, [CPU()], total_num_pages=16)
    ctxs = [FakeContext(f"r{i}", np.arange(n)) for i, n in enumerate(lengths)]
    for c in ctxs:
        mgr.claim(c.request_id)
    kv_in = mgr.fetch(ctxs)[0]
    batch_offs = np.array([0, 4, 9], np.uint32)
    types = [TensorType(DType.float32, t.shape, DEV) for t in (x, a, b)] + _group_types()
    types += [TensorType(DType.uint32, [3], DEV)]
    with Graph("qkv_lora", input_types=types + list(mgr.input_symbols()[0])) as g:
        xv, av, bv, ov, iv, rv, bo, *cache = g.inputs
        coll = FetchPagedKVCacheCollection(kvp, 1)(*cache)
        g.output(kernels.sgmv_qkv_lora_kernel(xv.tensor, av.tensor, bv.tensor, iv.tensor, rv.tensor, bo.tensor,
                                              ov.tensor, coll, kvp, 0, 3, R, qd, kvd))
    before = kv_in[0].to_numpy().copy()
    (q,) = InferenceSession().load(g).execute(*[Buffer.from_numpy(t) for t in (x, a, b, OFFS, IDS, RANKS,
                                                                               batch_offs)], *kv_in)
    parts = [_lora_ref(x, a[:, p * R:(p + 1) * R], b[:, lo:hi]) for p, (lo, hi) in
             enumerate(((0, qd), (qd, qd + kvd), (qd + kvd, qd + 2 * kvd)))]
    np.testing.assert_allclose(q.to_numpy(), parts[0], rtol=1e-5, atol=1e-5)
    blocks, lut = kv_in[0].to_numpy(), kv_in[2].to_numpy()
    t = 0
    for bi, n in enumerate(lengths):
        for i in range(n):
            page, off = lut[bi, i // 4], i % 4
            for plane in (0, 1):
                np.testing.assert_allclose(blocks[page, plane, 0, off].ravel(),
                                           before[page, plane, 0, off].ravel() + parts[1 + plane][t], rtol=1e-5,
                                           atol=1e-5)
            t += 1
