"""max.nn.kernels' float8 family on CPU against float64 numpy references, float8 rounding done by
ml_dtypes (independent of torch's conversion): quantisation (static / dynamic, per token and per
group), scaled matmuls, the fused QKV projection of float8 weights, and the exact E4M3FN -> E4M3FNUZ
conversion.  (MAX docs: max/api/python/nn/kernels, the float8 entries.)"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from max.driver import CPU, Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, Graph, TensorType
from max.nn import kernels, kernels_float8

CPU_REF = DeviceRef.CPU()
F8 = ml_dtypes.float8_e4m3fn
F8MAX = 448.0


def _run(types, build, *arrays):
    with Graph("f8", input_types=types) as g:
        outs = build(*[v.tensor for v in g.inputs])
        g.output(*(outs if isinstance(outs, (tuple, list)) else (outs,)))
    res = InferenceSession().load(g).execute(*[Buffer.from_numpy(a) for a in arrays])
    return [r.to_numpy() for r in res]


def _to_f8(x):  # saturate, then round to nearest even (ml_dtypes)
    return np.clip(np.asarray(x, np.float64), -F8MAX, F8MAX).astype(np.float32).astype(F8)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 5), st.integers(1, 9), st.floats(0.01, 50.0), st.booleans(), st.integers(0, 2**31 - 1))
def test_quantize_static(m, k, scale, inverted, seed):
    x = (np.random.default_rng(seed).standard_normal((m, k)) * 300).astype(np.float32)
    (q,) = _run([TensorType(DType.float32, [m, k], CPU_REF), TensorType(DType.float32, [], CPU_REF)],
                lambda xv, sv: kernels.quantize_static_scaled_float8(xv, sv, scale_is_inverted=inverted),
                x, np.float32(scale))
    assert q.dtype == F8
    want = _to_f8(x.astype(np.float64) * scale if inverted else x.astype(np.float64) / np.float32(scale))
    np.testing.assert_array_equal(q.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("group", [-1, 4])
def test_quantize_dynamic_per_token_and_group(group):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 8)) * np.array([[1], [100], [0], [1e4], [0.01]])).astype(np.float32)
    q, s = _run([TensorType(DType.float32, [5, 8], CPU_REF)],
                lambda xv: kernels.quantize_dynamic_scaled_float8(xv, None, None, scale_ub=1200.0,
                                                                  group_size_or_per_token=group,
                                                                  scales_type=DType.float32), x)
    g = 8 if group == -1 else group
    xs = x.astype(np.float64).reshape(5, 8 // g, g)
    s_ref = np.minimum(np.abs(xs).max(-1), 1200.0) / F8MAX
    np.testing.assert_allclose(s, s_ref.astype(np.float32), rtol=1e-6)
    sr = s.astype(np.float64)[..., None]
    q_ref = _to_f8(np.where(sr > 0, xs / np.where(sr > 0, sr, 1), 0)).reshape(5, 8)
    np.testing.assert_array_equal(q.view(np.uint8), q_ref.view(np.uint8))
    assert s.shape == (5, 8 // g)
    # the row with |x| up to 1e4 is clipped by scale_ub: its largest values saturate to 448
    assert np.abs(q.astype(np.float32)[3]).max() == F8MAX


def test_quantize_rejects_bad_input():
    with Graph("bad", input_types=[TensorType(DType.float32, [2, 6], CPU_REF)]) as g:
        x = g.inputs[0].tensor
        with pytest.raises(ValueError, match="group size 4"):
            kernels.quantize_dynamic_scaled_float8(x, group_size_or_per_token=4)
        with pytest.raises(TypeError, match="out_type"):
            kernels.quantize_static_scaled_float8(x, 1.0, out_type=DType.float16)


def test_scaled_matmuls():
    rng = np.random.default_rng(2)
    a, b = _to_f8(rng.standard_normal((4, 16)) * 4), _to_f8(rng.standard_normal((6, 16)) * 4)
    sa = rng.uniform(0.1, 2, (4, 1)).astype(np.float32)
    sb = rng.uniform(0.1, 2, (6, 1)).astype(np.float32)
    types = [TensorType(DType.float8_e4m3fn, [4, 16], CPU_REF), TensorType(DType.float8_e4m3fn, [6, 16], CPU_REF),
             TensorType(DType.float32, [4, 1], CPU_REF), TensorType(DType.float32, [6, 1], CPU_REF)]
    dyn, stat = _run(types, lambda av, bv, sav, sbv: (
        kernels.dynamic_scaled_matmul(av, bv, sav, sbv, None, None, out_type=DType.float32),
        kernels.matmul_static_scaled_float8(av, bv, 0.5, sbv).cast(DType.float32)), a, b, sa, sb)
    af, bf = a.astype(np.float64), b.astype(np.float64)
    np.testing.assert_allclose(dyn, (af * sa) @ (bf * sb).T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stat, ((af * 0.5) @ (bf * sb).T), rtol=1e-2, atol=1e-2)  # bfloat16 result


def test_e4m3fn_to_e4m3fnuz_is_exact():
    """Every E4M3FN bit pattern (NaNs aside) keeps its value once the FNUZ scale is doubled."""
    bits = np.arange(256, dtype=np.uint8)
    w = bits.view(F8)
    keep = ~np.isnan(w.astype(np.float32))
    w = w[keep].reshape(1, -1)
    n = w.shape[1]
    wq, s = _run([TensorType(DType.float8_e4m3fn, [1, n], CPU_REF), TensorType(DType.float32, [], CPU_REF)],
                 lambda wv, sv: kernels.normalize_e4m3fn_to_e4m3fnuz(wv, sv), w, np.float32(0.75))
    assert wq.dtype == ml_dtypes.float8_e4m3fnuz
    np.testing.assert_array_equal(wq.astype(np.float64) * float(s), w.astype(np.float64) * 0.75)
    assert not np.isnan(wq.astype(np.float32)).any()  # 0x80 (-0 in FN) became 0, not FNUZ's NaN
    assert kernels.needs_fp8_fnuz_conversion() is False  # no AMD CDNA3 GPU here
    with Graph("noop", input_types=[TensorType(DType.float8_e4m3fn, [1, n], CPU_REF)]) as g:
        wv = g.inputs[0].tensor
        assert kernels.convert_weights_to_fp8_fnuz_if_needed(wv, 2.0) == (wv, 2.0)


def test_fused_qkv_ragged_matmul_scaled_float8_writes_k_and_v():
    from max.nn.kv_cache import FetchPagedKVCacheCollection, KVCacheParams, PagedKVCacheManager

    from test_kv_cache_context import FakeContext

    H, HKV, D, hidden, lengths = 2, 1, 4, 8, [3, 2]
    T = sum(lengths)
    rng = np.random.default_rng(3)
    x, w = _to_f8(rng.standard_normal((T, hidden)) * 3), _to_f8(rng.standard_normal(((H + 2 * HKV) * D, hidden)))
    kvp = KVCacheParams(DType.float32, HKV, D, page_size=4)
    mgr = PagedKVCacheManager(kvp, 4, 16, 1, [CPU()], total_num_pages=8)
    ctxs = [FakeContext(f"r{i}", np.arange(n)) for i, n in enumerate(lengths)]
    for c in ctxs:
        mgr.claim(c.request_id)
    kv_in = mgr.fetch(ctxs)[0]
    types = [TensorType(DType.float8_e4m3fn, [T, hidden], CPU_REF),
             TensorType(DType.float8_e4m3fn, [(H + 2 * HKV) * D, hidden], CPU_REF),
             TensorType(DType.uint32, [len(lengths) + 1], CPU_REF)]
    with Graph("qkv8", input_types=types + list(mgr.input_symbols()[0])) as g:
        xv, wv, offs, *cache = g.inputs
        coll = FetchPagedKVCacheCollection(kvp, 1)(*cache)
        q = kernels.fused_qkv_ragged_matmul_scaled_float8(kvp, xv.tensor, offs.tensor, wv.tensor, coll, 0, H,
                                                          0.5, 0.25)
        g.output(q)
    offsets = np.cumsum([0] + lengths).astype(np.uint32)
    (q,) = InferenceSession().load(g).execute(*[Buffer.from_numpy(a) for a in (x, w, offsets)], *kv_in)
    ref = (x.astype(np.float64) * 0.5) @ (w.astype(np.float64) * 0.25).T
    np.testing.assert_allclose(q.to_numpy(), ref[:, :H * D], rtol=1e-5, atol=1e-5)
    blocks = kv_in[0].to_numpy()  # [pages, 2, layers, page_size, kv_heads, head_dim]
    lut = kv_in[2].to_numpy()
    start = 0
    for b, n in enumerate(lengths):
        for i in range(n):
            page, off = lut[b, i // 4], i % 4
            np.testing.assert_allclose(blocks[page, 0, 0, off, 0], ref[start + i, H * D:H * D + D], rtol=1e-5)
            np.testing.assert_allclose(blocks[page, 1, 0, off, 0], ref[start + i, H * D + D:], rtol=1e-5)
        start += n


@pytest.mark.parametrize("block", [None, (4, 8)])
def test_matmul_float8_weight_per_tensor_and_block_scales(block):
    """libremax's weight-only FP8 projection (FP8 checkpoints): x @ (w * scale).T, scales per tensor or per
    (bo x bi) block (ragged edge blocks included)."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 20)).astype(np.float32)
    w = _to_f8(rng.standard_normal((10, 20)) * 100)
    if block is None:
        s = np.float32(0.01)
        full = np.full((10, 20), 0.01)
    else:
        s = rng.uniform(0.001, 0.02, (-(-10 // block[0]), -(-20 // block[1]))).astype(np.float32)
        full = np.repeat(np.repeat(s.astype(np.float64), block[0], 0), block[1], 1)[:10, :20]
    types = [TensorType(DType.float32, [3, 20], CPU_REF), TensorType(DType.float8_e4m3fn, [10, 20], CPU_REF),
             TensorType(DType.float32, np.shape(s), CPU_REF)]
    (y,) = _run(types, lambda xv, wv, sv: kernels_float8.matmul_float8_weight(xv, wv, sv, block), x, w, s)
    np.testing.assert_allclose(y, x.astype(np.float64) @ (w.astype(np.float64) * full).T, rtol=1e-5, atol=1e-5)
