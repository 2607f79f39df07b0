"""max.nn's tensor-parallel layers on two logical CPU devices (``DeviceRef.CPU(0)``, ``CPU(1)``):
``RowParallelLinear`` against float64 numpy, and a ``DistributedTransformer`` of
``DistributedTransformerBlock`` s (``DistributedAttentionWithRope``, sharded ``MLP``,
``VocabParallelEmbedding``, ``ColumnParallelLinear``) against the ``Transformer`` of the same
weights on one device, over the paged KV cache (ragged prefill, then a decode step)."""

from __future__ import annotations

import numpy as np
import pytest

from max import nn
from max.driver import CPU as CPUDevice
from max.driver import Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, Graph, TensorType, ops
from max.nn.kv_cache import FetchPagedKVCacheCollection, KVCacheParams, PagedKVCacheManager

from test_kv_cache_context import FakeContext

F32 = DType.float32
D0, D1 = DeviceRef.CPU(0), DeviceRef.CPU(1)


def test_row_parallel_linear_sums_the_shards_and_adds_the_bias_once():
    rng = np.random.default_rng(0)
    lin = nn.RowParallelLinear(6, 5, F32, [D0, D1], has_bias=True)
    w, b = rng.standard_normal((5, 6)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    lin.load_state_dict({"weight": w, "bias": b})
    sig = nn.Signals([D0, D1])
    x = rng.standard_normal((4, 6)).astype(np.float32)
    with Graph("row", input_types=[TensorType(F32, [4, 3], D0), TensorType(F32, [4, 3], D1),
                                   *sig.input_types()]) as g:
        a, c, s0, s1 = g.inputs
        outs = lin([a.tensor, c.tensor], [s0.buffer, s1.buffer])
        assert [o.device for o in outs] == [D0, D1]
        g.output(*outs)
    model = InferenceSession(devices=[CPUDevice()]).load(g, weights_registry=lin.state_dict())
    y0, y1 = (o.to_numpy() for o in model.execute(x[:, :3].copy(), x[:, 3:].copy(), *sig.buffers()))
    want = x.astype(np.float64) @ w.T.astype(np.float64) + b
    np.testing.assert_allclose(y0, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y1, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="in_dim 7 does not split evenly across 2 devices"):
        nn.RowParallelLinear(7, 5, F32, [D0, D1])


H, HKV, HD, DIM, FF, VOCAB, LAYERS, PAGE = 4, 2, 8, 32, 48, 64, 2, 16


def _model(devs: list[DeviceRef]):
    n = len(devs)
    kvp = KVCacheParams(dtype=F32, n_kv_heads=HKV, head_dim=HD, page_size=PAGE, n_devices=n)
    rope = nn.RotaryEmbedding(DIM, H, 10000.0, 128, devs[0], head_dim=HD, interleaved=False)
    blocks = []
    for _ in range(LAYERS):
        kw = dict(rope=rope, num_attention_heads=H, num_key_value_heads=HKV, hidden_size=DIM, kv_params=kvp,
                  dtype=F32, has_bias=True)
        mlp = nn.MLP(F32, None, DIM, FF, [devs[0]])
        if n == 1:
            blocks.append(nn.TransformerBlock(nn.AttentionWithRope(devices=devs, **kw), mlp,
                                              nn.RMSNorm(DIM, F32, 1e-5), nn.RMSNorm(DIM, F32, 1e-5)))
        else:
            blocks.append(nn.DistributedTransformerBlock(nn.DistributedAttentionWithRope(devices=devs, **kw), mlp,
                                                         nn.RMSNorm(DIM, F32, 1e-5), nn.RMSNorm(DIM, F32, 1e-5),
                                                         devs))
    common = dict(dim=DIM, n_heads=H, layers=blocks, norm=nn.RMSNorm(DIM, F32, 1e-5), kv_params=kvp,
                  kv_collection_constructor=FetchPagedKVCacheCollection(kvp, LAYERS), rope=rope)
    if n == 1:
        model = nn.Transformer(output=nn.Linear(DIM, VOCAB, F32, devs[0]),
                               embedding=nn.Embedding(VOCAB, DIM, F32, devs[0]), **common)
    else:
        model = nn.DistributedTransformer(output=nn.ColumnParallelLinear(DIM, VOCAB, F32, devs),
                                          embedding=nn.VocabParallelEmbedding(VOCAB, DIM, F32, devs),
                                          devices=devs, **common)
    return model, kvp


def _run(devs: list[DeviceRef], weights: dict | None, prompts: dict, forced: dict):
    model, kvp = _model(devs)
    if weights is None:
        rng = np.random.default_rng(1)
        weights = {k: (rng.standard_normal(tuple(int(d) for d in w.shape)) * 0.3).astype(np.float32)
                   for k, w in model.state_dict().items()}
    model.load_state_dict(weights)
    session = InferenceSession(devices=[CPUDevice()])
    mgr = PagedKVCacheManager(kvp, max_batch_size=2, max_seq_len=64, num_layers=LAYERS, devices=[CPUDevice()] * len(devs),
                              session=session, total_num_pages=16)
    sig = nn.Signals(devs)
    syms = mgr.input_symbols(devices=devs)
    kv_types = [t for s in syms for t in s]
    head = [TensorType(DType.int64, ["total"], devs[0]), TensorType(DType.uint32, ["rows"], devs[0]),
            TensorType(DType.int64, [1], DeviceRef.CPU())]
    extra = sig.input_types() if len(devs) > 1 else []
    with Graph("tp", input_types=[*head, *extra, *kv_types]) as g:
        tok, offs, nl, *rest = g.inputs
        if len(devs) > 1:
            sigs = [v.buffer for v in rest[:len(devs)]]
            (logits,) = model(tok.tensor, sigs, rest[len(devs):], nl, offs.tensor)
        else:
            (logits,) = model(tok.tensor, rest, nl, offs.tensor)
        g.output(logits)
    compiled = session.load(g, weights_registry=model.state_dict())
    ctxs = [FakeContext(rid, p) for rid, p in prompts.items()]
    for c in ctxs:
        mgr.claim(c.request_id)
    out = []
    for step in range(2):
        kv = mgr.fetch(ctxs)
        toks = np.concatenate([c.tokens[c.start_idx:c.active_idx] for c in ctxs]).astype(np.int64)
        offsets = np.cumsum([0] + [c.active_idx - c.start_idx for c in ctxs]).astype(np.uint32)
        args = [Buffer.from_numpy(toks), Buffer.from_numpy(offsets), Buffer.from_numpy(np.array([1], np.int64))]
        if len(devs) > 1:
            args += sig.buffers()
        args += [b for per_dev in kv for b in per_dev]
        out.append(compiled.execute(*args)[0].to_numpy())
        for c in ctxs:
            c.tokens[c.end_idx] = forced[c.request_id][step]
            c.bump_token_indices(start_idx=c.active_idx - c.start_idx, active_idx=1, end_idx=1)
        mgr.step(ctxs)
    for c in ctxs:
        mgr.release(c.request_id)
    assert mgr.num_free_pages == mgr.total_num_pages
    return out, weights


def test_distributed_transformer_matches_the_one_device_transformer():
    rng = np.random.default_rng(2)
    prompts = {"a": rng.integers(0, VOCAB, 19).tolist(), "b": rng.integers(0, VOCAB, 5).tolist()}
    forced = {rid: rng.integers(0, VOCAB, 2).tolist() for rid in prompts}
    ref, weights = _run([D0], None, prompts, forced)
    got, _ = _run([D0, D1], weights, prompts, forced)
    for step, (a, b) in enumerate(zip(got, ref)):
        assert a.shape == b.shape == (2, VOCAB)
        err = float(np.abs(a - b).max())
        assert err <= 1e-5 * max(1.0, float(np.abs(b).max())), f"step {step}: max |diff| {err:.3g}"


def test_distributed_attention_checks_its_split():
    kvp = KVCacheParams(dtype=F32, n_kv_heads=2, head_dim=8, page_size=16, n_devices=2)
    rope = nn.RotaryEmbedding(24, 3, 1e4, 64, D0, head_dim=8)
    with pytest.raises(ValueError, match="needs at least 2 devices"):
        nn.DistributedAttentionWithRope(rope=rope, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
                                        kv_params=kvp, devices=[D0])
    with pytest.raises(ValueError, match="num_attention_heads = 3 does not split evenly across 2 devices"):
        nn.DistributedAttentionWithRope(rope=rope, num_attention_heads=3, num_key_value_heads=1, hidden_size=24,
                                        kv_params=kvp, devices=[D0, D1])
    one = KVCacheParams(dtype=F32, n_kv_heads=2, head_dim=8, page_size=16)
    with pytest.raises(ValueError, match="kv_params.n_devices is 1, expected 2"):
        nn.DistributedAttentionWithRope(rope=rope, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
                                        kv_params=one, devices=[D0, D1])
