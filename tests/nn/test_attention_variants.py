"""max.nn.attention's remaining layers -- AttentionWithRopeV1, AttentionWithRopeQKV (dataclass-style, the
interfaces' AttentionImpl / AttentionImplQKV), GGUFQAttentionWithRope (GGML-quantised projections) --
and the module paths interfaces / ragged_attention, against a float64 numpy RoPE attention reference.
(MAX docs: max/api/python/nn/attention/attention_with_rope, .../interfaces, .../ragged_attention.)"""

from __future__ import annotations

import numpy as np
import pytest

from max.driver import CPU, Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, Graph, TensorType
from max.nn.attention.attention_with_rope import (AttentionWithRopeQKV, AttentionWithRopeV1, GGUFQAttentionWithRope,
                                                  GPTQAttentionWithRope, distribute_value)
from max.nn.attention.interfaces import AttentionImpl, AttentionImplQKV, DistributedAttentionImpl
from max.nn.kv_cache import FetchPagedKVCacheCollection, KVCacheParams, PagedKVCacheManager
from max.nn.linear import LinearV1
from max.nn.rotary_embedding import RotaryEmbedding
from test_kv_cache_context import FakeContext

DEV = DeviceRef.CPU()
H, HKV, D, HIDDEN = 4, 2, 8, 32
LENGTHS = [5, 3]
T = sum(LENGTHS)


def _rope(x, pos):
    inv = 10000.0 ** (-np.arange(0, D, 2) / D)
    ang = pos[:, None, None] * inv[None, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * np.cos(ang) - b * np.sin(ang), a * np.sin(ang) + b * np.cos(ang)
    return out


def _reference(x, wq, wk, wv, wo, scale):
    out = np.zeros((T, HIDDEN))
    s0 = 0
    for n in LENGTHS:
        xs = x[s0:s0 + n].astype(np.float64)
        pos = np.arange(n, dtype=np.float64)
        q = _rope((xs @ wq.T).reshape(n, H, D), pos)
        k = np.repeat(_rope((xs @ wk.T).reshape(n, HKV, D), pos), H // HKV, axis=1)
        v = np.repeat((xs @ wv.T).reshape(n, HKV, D), H // HKV, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) * scale
        s = np.where(np.tril(np.ones((n, n), bool))[None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[s0:s0 + n] = np.einsum("hqk,khd->qhd", p, v).reshape(n, H * D) @ wo.T
        s0 += n
    return out


def _cache():
    kvp = KVCacheParams(DType.float32, HKV, D, page_size=4)
    mgr = PagedKVCacheManager(kvp, 4, 32, 1, [CPU()], total_num_pages=16)
    ctxs = [FakeContext(f"r{i}", np.arange(n)) for i, n in enumerate(LENGTHS)]
    for c in ctxs:
        mgr.claim(c.request_id)
    return kvp, mgr, mgr.fetch(ctxs)[0]


def _weights(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, HIDDEN)).astype(np.float32)
    ws = [(rng.standard_normal(s) / 4).astype(np.float32) for s in
          ((H * D, HIDDEN), (HKV * D, HIDDEN), (HKV * D, HIDDEN), (HIDDEN, H * D))]
    return x, ws


@pytest.mark.parametrize("kind", ["v1", "qkv"])
def test_dataclass_attention_layers(kind):
    x, (wq, wk, wv, wo) = _weights(0)
    kvp, mgr, kv_in = _cache()
    rope = RotaryEmbedding(H * D, H, 10000.0, 32, DEV, interleaved=True)
    types = [TensorType(DType.float32, a.shape, DEV) for a in (x, wq, wk, wv, wo)]
    types += [TensorType(DType.uint32, [3], DEV)]
    with Graph("attn_v1", input_types=types + list(mgr.input_symbols()[0])) as g:
        xv, q_, k_, v_, o_, ov, *cache = g.inputs
        xv, q_, k_, v_, o_, ov = (i.tensor for i in (xv, q_, k_, v_, o_, ov))
        coll = FetchPagedKVCacheCollection(kvp, 1)(*cache)
        if kind == "v1":
            from max.graph import ops

            layer = AttentionWithRopeV1(H, kvp, ops.concat([q_, k_, v_], axis=0), LinearV1(o_), 0.3, rope)
            assert isinstance(layer, AttentionImpl)
        else:
            layer = AttentionWithRopeQKV(H, kvp, q_, k_, v_, LinearV1(o_), 0.3, rope)
            assert isinstance(layer, AttentionImplQKV)
        with pytest.raises(ValueError, match="layer_idx"):
            layer(xv, coll, input_row_offsets=ov)
        g.output(layer(xv, coll, input_row_offsets=ov, layer_idx=0))
    offs = np.cumsum([0] + LENGTHS).astype(np.uint32)
    (out,) = InferenceSession().load(g).execute(*[Buffer.from_numpy(a) for a in (x, wq, wk, wv, wo, offs)], *kv_in)
    np.testing.assert_allclose(out.to_numpy(), _reference(x, wq, wk, wv, wo, 0.3), rtol=1e-4, atol=1e-4)


def test_gguf_quantized_attention(monkeypatch):
    gguf = pytest.importorskip("gguf")
    from gguf import quants

    from max.graph.quantization import QuantizationEncoding as Q

    monkeypatch.setenv("LIBREMAX_QMATMUL", "exact")
    x, ws = _weights(1)
    qws = [quants.quantize(w, gguf.GGMLQuantizationType.Q8_0) for w in ws]
    deq = [quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0).astype(np.float64) for q in qws]
    kvp, mgr, kv_in = _cache()
    rope = RotaryEmbedding(H * D, H, 10000.0, 32, DEV, interleaved=True)
    attn = GGUFQAttentionWithRope(rope=rope, num_attention_heads=H, num_key_value_heads=HKV, hidden_size=HIDDEN,
                                  kv_params=kvp, dtype=DType.uint8, quantization_encoding=Q.Q8_0, scale=0.3)
    from max.graph.weights import WeightData

    attn.load_state_dict({f"{n}.weight": WeightData(q, f"{n}.weight", DType.uint8, q.shape, Q.Q8_0)
                          for n, q in zip(("q_proj", "k_proj", "v_proj", "o_proj"), qws)})
    types = [TensorType(DType.float32, x.shape, DEV), TensorType(DType.uint32, [3], DEV)]
    with Graph("attn_gguf", input_types=types + list(mgr.input_symbols()[0])) as g:
        xv, ov, *cache = g.inputs
        coll = FetchPagedKVCacheCollection(kvp, 1)(*cache)
        assert int(attn.wqkv.shape[0]) == (H + 2 * HKV) * D
        g.output(attn(0, xv.tensor, coll, rope.freqs_cis, ov.tensor))
    offs = np.cumsum([0] + LENGTHS).astype(np.uint32)
    (out,) = InferenceSession().load(g, weights_registry=attn.state_dict()).execute(
        Buffer.from_numpy(x), Buffer.from_numpy(offs), *kv_in)
    np.testing.assert_allclose(out.to_numpy(), _reference(x, *deq, 0.3), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="GGML block encoding"):
        GGUFQAttentionWithRope(rope=rope, num_attention_heads=H, num_key_value_heads=HKV, hidden_size=HIDDEN,
                               kv_params=kvp, dtype=DType.uint8, quantization_encoding=Q.GPTQ)


def test_gptq_attention_declares_gptq_projections_and_module_paths():
    from max.graph.quantization import QuantizationConfig
    from max.nn.attention.ragged_attention import RaggedAttention
    from max.nn.attention import RaggedAttention as Same
    from max.nn.linear import GPTQLinear

    kvp = KVCacheParams(DType.float32, HKV, D, page_size=4)
    rope = RotaryEmbedding(H * D, H, 10000.0, 32, DEV)
    cfg = QuantizationConfig(quant_method="gptq", bits=4, group_size=32, desc_act=True)
    attn = GPTQAttentionWithRope(cfg, rope, H, HKV, HIDDEN, kvp)
    assert all(isinstance(p, GPTQLinear) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    assert attn.q_proj.perm_idx is not None and attn.quantization_config is cfg
    assert RaggedAttention is Same
    assert issubclass(DistributedAttentionImpl, object) and callable(distribute_value)
    with Graph("dv", input_types=[TensorType(DType.float32, [2], DEV)]) as g:
        vals = distribute_value(g.inputs[0].tensor, [DEV, DEV])
        assert len(vals) == 2 and all(v.device == DEV for v in vals)


def test_forward_sharded_layers_and_take():
    from max.nn.transformer.distributed_transformer import forward_sharded_layers, take

    assert forward_sharded_layers([lambda v: v + 1, lambda v: v * 2], [1, 5]) == [2, 10]
    with pytest.raises(AssertionError):
        forward_sharded_layers([lambda v: v], [1, 2])
    it = iter(range(5))
    assert take(it, 2) == [0, 1] and take(it, 5) == [2, 3, 4] and take(it, 1) == []


def _gptq(n, k, rng, perm=None):
    """Random symmetric GPTQ rows (group 32) of an [n, k] projection, and the float weight they hold over
    the inputs (``perm``: act-order, weight column j multiplies input perm[j])."""
    from max.graph.quantization.gptq import pack_gptq_rows

    codes = rng.integers(0, 16, (n, k))
    scales = (rng.uniform(0.01, 0.05, (n, k // 32))).astype(np.float16)
    stored = np.repeat(scales.astype(np.float64), 32, axis=1) * (codes - 8)
    w = np.empty_like(stored)
    w[:, perm if perm is not None else np.arange(k)] = stored
    import torch

    return pack_gptq_rows(torch.from_numpy(codes), torch.from_numpy(scales)).numpy(), w


def test_gptq_attention_runs_the_int4_kernels(monkeypatch):
    """GPTQAttentionWithRope (act-order perm_idx per projection) equals float64 attention on the weights its
    GPTQ rows hold; LIBREMAX_QMATMUL=exact: float32 activations, so float32 tolerance."""
    from max.graph.quantization import QuantizationConfig, QuantizationEncoding
    from max.graph.weights import WeightData

    monkeypatch.setenv("LIBREMAX_QMATMUL", "exact")
    rng = np.random.default_rng(7)
    x, (_, _, _, wo) = _weights(2)
    perms = [rng.permutation(HIDDEN).astype(np.int32) for _ in range(3)]
    (rq, wq), (rk, wk), (rv, wv) = (_gptq(n, HIDDEN, rng, p) for n, p in zip((H * D, HKV * D, HKV * D), perms))
    kvp, mgr, kv_in = _cache()
    rope = RotaryEmbedding(H * D, H, 10000.0, 32, DEV, interleaved=True)
    cfg = QuantizationConfig(quant_method="gptq", bits=4, group_size=32, desc_act=True, sym=True)
    attn = GPTQAttentionWithRope(cfg, rope, H, HKV, HIDDEN, kvp, scale=0.3)
    state = {"o_proj.weight": wo}
    for name, rows, perm in zip(("q_proj", "k_proj", "v_proj"), (rq, rk, rv), perms):
        state[f"{name}.weight"] = WeightData(rows, f"{name}.weight", DType.uint8, rows.shape, QuantizationEncoding.GPTQ)
        state[f"{name}.perm_idx"] = perm
    attn.load_state_dict(state)
    types = [TensorType(DType.float32, x.shape, DEV), TensorType(DType.uint32, [3], DEV)]
    with Graph("attn_gptq", input_types=types + list(mgr.input_symbols()[0])) as g:
        xv, ov, *cache = g.inputs
        coll = FetchPagedKVCacheCollection(kvp, 1)(*cache)
        g.output(attn(0, xv.tensor, coll, rope.freqs_cis, ov.tensor))
    offs = np.cumsum([0] + LENGTHS).astype(np.uint32)
    (out,) = InferenceSession().load(g, weights_registry=attn.state_dict()).execute(
        Buffer.from_numpy(x), Buffer.from_numpy(offs), *kv_in)
    np.testing.assert_allclose(out.to_numpy(), _reference(x, wq, wk, wv, wo, 0.3), rtol=1e-4, atol=1e-4)


def test_fused_qkv_ragged_matmul_quantized(monkeypatch):
    """The GPTQ fused QKV projection (weights a graph input: repacked per call), one perm_idx and a bias:
    Q equals x[:, perm] @ W_q.T + b_q in float64."""
    from max.graph.quantization import QuantizationConfig
    from max.nn import kernels

    monkeypatch.setenv("LIBREMAX_QMATMUL", "exact")
    rng = np.random.default_rng(8)
    x = rng.standard_normal((T, HIDDEN)).astype(np.float32)
    perm = rng.permutation(HIDDEN).astype(np.int32)
    rows, w = _gptq((H + 2 * HKV) * D, HIDDEN, rng, perm)
    bias = rng.standard_normal((H + 2 * HKV) * D).astype(np.float32)
    kvp, mgr, kv_in = _cache()
    cfg = QuantizationConfig(quant_method="gptq", bits=4, group_size=32, desc_act=True, sym=True)
    types = [TensorType(DType.float32, [T, HIDDEN], DEV), TensorType(DType.uint8, list(rows.shape), DEV),
             TensorType(DType.int32, [HIDDEN], DEV), TensorType(DType.float32, list(bias.shape), DEV),
             TensorType(DType.uint32, [3], DEV)]
    with Graph("gptq", input_types=types + list(mgr.input_symbols()[0])) as g:
        xv, wv, pv, bv, ov, *cache = g.inputs
        coll = FetchPagedKVCacheCollection(kvp, 1)(*cache)
        g.output(kernels.fused_qkv_ragged_matmul_quantized(kvp, xv.tensor, ov.tensor, wv.tensor, coll, 0, H, cfg,
                                                           perm_idx=pv.tensor, bias=bv.tensor))
    offs = np.cumsum([0] + LENGTHS).astype(np.uint32)
    (q,) = InferenceSession().load(g).execute(*[Buffer.from_numpy(a) for a in (x, rows, perm, bias, offs)], *kv_in)
    want = x.astype(np.float64) @ w[:H * D].T + bias[:H * D]
    np.testing.assert_allclose(q.to_numpy().reshape(T, -1), want, rtol=1e-4, atol=1e-4)
    with Graph("gptq_bad", input_types=types + list(mgr.input_symbols()[0])) as g:
        xv, wv, pv, bv, ov, *cache = g.inputs
        coll = FetchPagedKVCacheCollection(kvp, 1)(*cache)
        with pytest.raises(ValueError, match="8-bit"):
            kernels.fused_qkv_ragged_matmul_quantized(kvp, xv.tensor, ov.tensor, wv.tensor, coll, 0, H,
                                                      QuantizationConfig("gptq", 8, 32))
