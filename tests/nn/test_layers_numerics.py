"""Layer numerics against torch.nn / Hugging Face on the same random weights.

Each layer's weights are loaded with ``load_state_dict`` and the graph is run
with ``weights_registry=module.state_dict()``.  float64 layers are compared at
rtol 1e-12, float32 ones at rtol 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from max.dtype import DType
from max.graph import DeviceRef
from max import nn

from support import run_graph, tt
from support import test_device_ref as dev_ref

F64, F32 = DType.float64, DType.float32
from max.graph import ops as _ops

needs_conv = pytest.mark.skipif(not hasattr(_ops, "conv2d") or not hasattr(_ops, "conv3d"),
                                reason="ops.conv2d/conv3d (src/max/graph/ops/conv.py) not in this checkout yet")
TOL = {F64: dict(rtol=1e-12, atol=1e-12), F32: dict(rtol=1e-5, atol=1e-6)}


def rand(rng, shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def load_random(module, rng, np_dtype):
    sd = {}
    for k, w in module.raw_state_dict().items():
        sd[k] = rand(rng, [int(d) for d in w.shape], w.dtype.to_numpy())
    module.load_state_dict(sd)
    return sd


def run(module, x, in_shape=None, dtype=F64):
    in_shape = in_shape if in_shape is not None else list(x.shape)
    (out,) = run_graph(lambda v: module(v), [tt(dtype, in_shape)], x, weights=module.state_dict())
    return out


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("has_bias", [False, True])
def test_linear_matches_torch(dtype, has_bias):
    rng = np.random.default_rng(1)
    npdt = dtype.to_numpy()
    lin = nn.Linear(7, 5, dtype, dev_ref(), has_bias=has_bias, name="proj")
    sd = load_random(lin, rng, npdt)
    ref = torch.nn.Linear(7, 5, bias=has_bias, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(sd["proj.weight"].astype(np.float64)))  # name= names the weights
        if has_bias:
            ref.bias.copy_(torch.from_numpy(sd["proj.bias"].astype(np.float64)))
    x = rand(rng, (3, 2, 7), npdt)
    got = run(lin, x, [3, "s", 7], dtype)
    want = ref(torch.from_numpy(x.astype(np.float64))).detach().numpy()
    np.testing.assert_allclose(got, want, **TOL[dtype])


def test_linear_clip_weight():
    rng = np.random.default_rng(2)
    lin = nn.Linear(4, 3, F64, dev_ref(), clip_weight=0.5)
    sd = load_random(lin, rng, np.float64)
    x = rand(rng, (2, 4))
    np.testing.assert_allclose(run(lin, x), x @ np.clip(sd["weight"], -0.5, 0.5).T, rtol=1e-12)


@pytest.mark.parametrize("act,ref", [
    ("silu", torch.nn.functional.silu),
    ("gelu", torch.nn.functional.gelu),
    ("gelu_tanh", lambda t: torch.nn.functional.gelu(t, approximate="tanh")),
    ("relu", torch.relu), ("tanh", torch.tanh), ("sigmoid", torch.sigmoid),
])
def test_mlp_matches_torch(act, ref):
    rng = np.random.default_rng(3)
    mlp = nn.MLP(F64, None, 6, 10, [dev_ref()], has_bias=True, activation_function=act)
    sd = load_random(mlp, rng, np.float64)
    assert list(sd) == ["gate_proj.weight", "gate_proj.bias", "down_proj.weight", "down_proj.bias",
                        "up_proj.weight", "up_proj.bias"]
    t = {k: torch.from_numpy(v) for k, v in sd.items()}
    x = rand(rng, (4, 6))
    tx = torch.from_numpy(x)
    g = tx @ t["gate_proj.weight"].T + t["gate_proj.bias"]
    u = tx @ t["up_proj.weight"].T + t["up_proj.bias"]
    want = (ref(g) * u) @ t["down_proj.weight"].T + t["down_proj.bias"]
    np.testing.assert_allclose(run(mlp, x), want.numpy(), rtol=1e-11, atol=1e-12)


def test_mlp_shards_sum_to_full():
    rng = np.random.default_rng(4)
    dev = dev_ref()
    mlp = nn.MLP(F64, None, 4, 8, [dev])
    from max.graph.weight import ShardingStrategy

    load_random(mlp, rng, np.float64)
    mlp.sharding_strategy = ShardingStrategy.rowwise(2)
    shards = mlp.shard([dev, dev])
    x = rand(rng, (3, 4))
    outs = run_graph(lambda v: [s(v) for s in shards] + [mlp(v)], [tt(F64, [3, 4])], x, weights=mlp.state_dict())
    np.testing.assert_allclose(outs[0] + outs[1], outs[2], rtol=1e-12)
    assert int(shards[0].gate_proj.weight.shape[0]) == 4


def test_column_parallel_linear_allgathers():
    rng = np.random.default_rng(5)
    dev = dev_ref()
    cpl = nn.ColumnParallelLinear(5, 6, F64, devices=[dev, dev], has_bias=True)
    sd = load_random(cpl, rng, np.float64)
    x = rand(rng, (2, 5))
    outs = run_graph(lambda v: cpl(v), [tt(F64, [2, 5])], x, weights=cpl.state_dict())
    want = x @ sd["weight"].T + sd["bias"]
    assert len(outs) == 2
    for o in outs:
        np.testing.assert_allclose(o, want, rtol=1e-12)


def test_column_parallel_tied_weight():
    dev = dev_ref()
    emb = nn.Embedding(6, 4, F64, dev)
    head = nn.ColumnParallelLinear(4, 6, F64, devices=[dev], tied_weight=emb.weight)
    assert head.weight is emb.weight
    assert list(head.raw_state_dict()) == []


@pytest.mark.parametrize("dtype", [F64, F32])
def test_embedding_matches_torch(dtype):
    rng = np.random.default_rng(6)
    emb = nn.Embedding(11, 5, dtype, dev_ref(), name="tok")
    sd = load_random(emb, rng, dtype.to_numpy())
    ref = torch.nn.Embedding(11, 5, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(sd["tok"].astype(np.float64)))  # Embedding(name="tok") owns "tok"
    idx = rng.integers(0, 11, (3, 4)).astype(np.int64)
    (got,) = run_graph(lambda v: emb(v), [tt(DType.int64, [3, "s"])], idx, weights=emb.state_dict())
    assert got.shape == (3, 4, 5)
    np.testing.assert_allclose(got, ref(torch.from_numpy(idx)).detach().numpy(), **TOL[dtype])


def test_vocab_parallel_embedding_matches_full_table():
    rng = np.random.default_rng(7)
    dev = dev_ref()
    emb = nn.VocabParallelEmbedding(12, 3, F64, devices=[dev, dev])
    sd = load_random(emb, rng, np.float64)
    idx = np.array([[0, 5, 6, 11], [3, 9, 2, 7]], dtype=np.int32)
    outs = run_graph(lambda v: emb(v), [tt(DType.int32, [2, 4])], idx, weights=emb.state_dict())
    for o in outs:
        np.testing.assert_allclose(o, sd["weight"][idx], rtol=1e-12)
    # the example's `device=` keyword
    emb2 = nn.VocabParallelEmbedding(vocab_size=12, hidden_dim=3, dtype=F64, device=[dev, dev], name="e")
    assert emb2.devices == [dev, dev]


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("use_bias", [True, False])
def test_layer_norm_matches_torch(dtype, use_bias):
    rng = np.random.default_rng(8)
    ln = nn.LayerNorm(6, dev_ref(), dtype, eps=1e-5, use_bias=use_bias)
    sd = load_random(ln, rng, dtype.to_numpy())
    ref = torch.nn.LayerNorm(6, eps=1e-5, bias=use_bias, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(sd["weight"].astype(np.float64)))
        if use_bias:
            ref.bias.copy_(torch.from_numpy(sd["bias"].astype(np.float64)))
    x = rand(rng, (2, 3, 6), dtype.to_numpy())
    want = ref(torch.from_numpy(x.astype(np.float64))).detach().numpy()
    np.testing.assert_allclose(run(ln, x, dtype=dtype), want, **TOL[dtype])


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape", [(2, 6, 5), (2, 6, 3, 4)])
def test_group_norm_matches_torch(affine, shape):
    rng = np.random.default_rng(9)
    gn = nn.GroupNorm(3, 6, eps=1e-5, affine=affine, device=dev_ref())
    ref = torch.nn.GroupNorm(3, 6, eps=1e-5, affine=affine, dtype=torch.float64)
    if affine:
        sd = load_random(gn, rng, np.float32)
        with torch.no_grad():
            ref.weight.copy_(torch.from_numpy(sd["weight"].astype(np.float64)))
            ref.bias.copy_(torch.from_numpy(sd["bias"].astype(np.float64)))
    x = rand(rng, shape)
    got = run(gn, x, dtype=F64)
    np.testing.assert_allclose(got, ref(torch.from_numpy(x)).detach().numpy(), rtol=1e-10, atol=1e-10)


def _hf_rms_norm(dim, eps, weight, x):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    ref = LlamaRMSNorm(dim, eps=eps)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(weight))
    return ref(torch.from_numpy(x)).detach().numpy()


@pytest.mark.parametrize("multiply_before_cast", [False, True])
def test_rms_norm_matches_llama_rms_norm(multiply_before_cast):
    rng = np.random.default_rng(10)
    norm = nn.RMSNorm(8, F32, eps=1e-6, multiply_before_cast=multiply_before_cast)
    sd = load_random(norm, rng, np.float32)
    x = rand(rng, (2, 3, 8), np.float32)
    got = run(norm, x, ["b", 3, 8], F32)
    np.testing.assert_allclose(got, _hf_rms_norm(8, 1e-6, sd["weight"], x), rtol=1e-5, atol=1e-6)


def test_rms_norm_weight_offset_gemma_style():
    rng = np.random.default_rng(11)
    norm = nn.RMSNorm(8, F32, eps=1e-6, weight_offset=1.0, multiply_before_cast=True)
    sd = load_random(norm, rng, np.float32)
    x = rand(rng, (4, 8), np.float32)
    # Gemma: x_normed * (1 + w), i.e. LlamaRMSNorm with weight 1 + w
    want = _hf_rms_norm(8, 1e-6, (1.0 + sd["weight"]).astype(np.float32), x)
    np.testing.assert_allclose(run(norm, x, dtype=F32), want, rtol=1e-5, atol=1e-6)


def test_rms_norm_v1_and_shard():
    rng = np.random.default_rng(12)
    w = rand(rng, (8,), np.float32)
    x = rand(rng, (3, 8), np.float32)
    from max.graph import ops

    (got,) = run_graph(lambda v: nn.RMSNormV1(ops.constant(w, F32, dev_ref()), eps=1e-6,
                                              multiply_before_cast=False)(v), [tt(F32, [3, 8])], x)
    np.testing.assert_allclose(got, _hf_rms_norm(8, 1e-6, w, x), rtol=1e-5, atol=1e-6)
    norm = nn.RMSNorm(8, F32)
    norm.load_state_dict({"weight": w})
    shards = norm.shard([dev_ref(), dev_ref()])
    outs = run_graph(lambda v: [s(v) for s in shards], [tt(F32, [3, 8])], x, weights=norm.state_dict())
    for o in outs:
        np.testing.assert_allclose(o, _hf_rms_norm(8, 1e-6, w, x), rtol=1e-5, atol=1e-6)


def test_layer_norm_v1():
    rng = np.random.default_rng(13)
    w, b = rand(rng, (5,)), rand(rng, (5,))
    x = rand(rng, (2, 5))
    from max.graph import ops

    (got,) = run_graph(lambda v: nn.LayerNormV1(ops.constant(w, F64, dev_ref()),
                                                ops.constant(b, F64, dev_ref()), eps=1e-6)(v),
                       [tt(F64, [2, 5])], x)
    want = torch.nn.functional.layer_norm(torch.from_numpy(x), (5,), torch.from_numpy(w), torch.from_numpy(b), 1e-6)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------- convolutions
def _torch_conv(nd, x_cl, w_torch, b, stride, padding, dilation, groups):
    """Reference: torch convNd on channels-first input; padding per dim (before, after)."""
    x = torch.from_numpy(np.moveaxis(x_cl, -1, 1).copy())
    pads = []
    for i in reversed(range(nd)):
        pads += [padding[2 * i], padding[2 * i + 1]]
    x = torch.nn.functional.pad(x, pads)
    fn = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d, 3: torch.nn.functional.conv3d}[nd]
    y = fn(x, torch.from_numpy(w_torch), None if b is None else torch.from_numpy(b), stride=stride,
           dilation=dilation, groups=groups)
    return np.moveaxis(y.numpy(), 1, -1)


@needs_conv
@pytest.mark.parametrize("permute", [False, True])
@pytest.mark.parametrize("groups", [1, 2])
def test_conv1d_matches_torch(permute, groups):
    rng = np.random.default_rng(14)
    conv = nn.Conv1D(3, 4, 6, F64, stride=2, padding=1, dilation=1, num_groups=groups, has_bias=True,
                     permute=permute, device=dev_ref(), name="c")
    sd = load_random(conv, rng, np.float64)
    assert list(sd) == ["c.weight", "c.bias"] and conv.filter is conv.weight  # name= names the weights
    w = sd["c.weight"]
    w_t = w if permute else np.transpose(w, (2, 1, 0))  # MAX (k, C/g, F) -> torch (F, C/g, k)
    x = rand(rng, (2, 9, 4))
    want = _torch_conv(1, x, np.ascontiguousarray(w_t), sd["c.bias"], (2,), (1, 1), (1,), groups)
    np.testing.assert_allclose(run(conv, x), want, rtol=1e-11, atol=1e-12)


@needs_conv
@pytest.mark.parametrize("permute", [False, True])
@pytest.mark.parametrize("padding", [1, (1, 2), (0, 1, 2, 1)])
def test_conv2d_matches_torch(permute, padding):
    rng = np.random.default_rng(15)
    conv = nn.Conv2d((3, 2), 4, 6, F64, stride=(1, 2), padding=padding, dilation=(2, 1), num_groups=2,
                     has_bias=True, permute=permute, device=dev_ref())
    sd = load_random(conv, rng, np.float64)
    w = sd["weight"]
    w_t = w if permute else np.transpose(w, (3, 2, 0, 1))
    pads = {1: (1, 1, 1, 1), (1, 2): (1, 1, 2, 2), (0, 1, 2, 1): (0, 1, 2, 1)}[padding]
    x = rand(rng, (2, 8, 7, 4))
    want = _torch_conv(2, x, np.ascontiguousarray(w_t), sd["bias"], (1, 2), pads, (2, 1), 2)
    np.testing.assert_allclose(run(conv, x), want, rtol=1e-11, atol=1e-12)


@needs_conv
@pytest.mark.parametrize("permute", [False, True])
def test_conv3d_matches_torch(permute):
    rng = np.random.default_rng(16)
    conv = nn.Conv3D(2, 3, 2, 3, 4, F64, stride=(1, 2, 1), padding=(1, 0, 1, 1, 0, 1), has_bias=True,
                     permute=permute, device=dev_ref())
    sd = load_random(conv, rng, np.float64)
    w = sd["weight"]
    w_t = w if permute else np.transpose(w, (4, 3, 0, 1, 2))
    x = rand(rng, (1, 4, 6, 5, 3))
    want = _torch_conv(3, x, np.ascontiguousarray(w_t), sd["bias"], (1, 2, 1), (1, 0, 1, 1, 0, 1), (1, 1, 1), 1)
    np.testing.assert_allclose(run(conv, x), want, rtol=1e-11, atol=1e-12)


@needs_conv
def test_conv_v1_layers_match_torch():
    from max.graph import ops

    rng = np.random.default_rng(17)
    dev = dev_ref()
    w1, b1 = rand(rng, (3, 4, 5)), rand(rng, (5,))
    w2 = rand(rng, (2, 2, 4, 5))
    w3 = rand(rng, (2, 2, 2, 4, 5))
    x1, x2, x3 = rand(rng, (1, 7, 4)), rand(rng, (1, 5, 5, 4)), rand(rng, (1, 4, 4, 4, 4))

    def fwd(a, b, c):
        c1 = nn.Conv1DV1(ops.constant(w1, F64, dev), ops.constant(b1, F64, dev), stride=1, padding=1)
        c2 = nn.Conv2dV1(ops.constant(w2, F64, dev), stride=(2, 1), padding=(1, 0, 0, 1))
        c3 = nn.Conv3DV1(ops.constant(w3, F64, dev), dilation=(1, 2, 1))
        return c1(a), c2(b), c3(c)

    o1, o2, o3 = run_graph(fwd, [tt(F64, x1.shape), tt(F64, x2.shape), tt(F64, x3.shape)], x1, x2, x3)
    np.testing.assert_allclose(o1, _torch_conv(1, x1, np.ascontiguousarray(w1.transpose(2, 1, 0)), b1, (1,),
                                               (1, 1), (1,), 1), rtol=1e-11)
    np.testing.assert_allclose(o2, _torch_conv(2, x2, np.ascontiguousarray(w2.transpose(3, 2, 0, 1)), None,
                                               (2, 1), (1, 0, 0, 1), (1, 1), 1), rtol=1e-11)
    np.testing.assert_allclose(o3, _torch_conv(3, x3, np.ascontiguousarray(w3.transpose(4, 3, 0, 1, 2)), None,
                                               (1, 1, 1), (0,) * 6, (1, 2, 1), 1), rtol=1e-11)


def test_sequential_chains_layers():
    rng = np.random.default_rng(18)
    dev = dev_ref()
    seq = nn.Sequential([nn.Linear(4, 6, F64, dev), nn.LayerNorm(6, dev, F64), nn.Linear(6, 2, F64, dev)])
    sd = load_random(seq, rng, np.float64)
    assert list(sd) == ["0.weight", "1.weight", "1.bias", "2.weight"]
    x = rand(rng, (3, 4))
    h = x @ sd["0.weight"].T
    h = torch.nn.functional.layer_norm(torch.from_numpy(h), (6,), torch.from_numpy(sd["1.weight"]),
                                       torch.from_numpy(sd["1.bias"]), 1e-5).numpy()
    np.testing.assert_allclose(run(seq, x), h @ sd["2.weight"].T, rtol=1e-11, atol=1e-12)


def test_linear_v1_mlp_v1_and_create():
    from max.graph import Weight, ops

    rng = np.random.default_rng(19)
    dev = dev_ref()
    wg, wu, wd = rand(rng, (6, 4)), rand(rng, (6, 4)), rand(rng, (4, 6))
    x = rand(rng, (2, 4))

    def fwd(v):
        c = lambda a: ops.constant(a, F64, dev)  # noqa: E731
        m = nn.MLPV1(nn.LinearV1(c(wg)), nn.LinearV1(c(wd)), nn.LinearV1(c(wu)))
        return m(v)

    (got,) = run_graph(fwd, [tt(F64, [2, 4])], x)
    t = lambda a: torch.from_numpy(a)  # noqa: E731
    want = (torch.nn.functional.silu(t(x) @ t(wg).T) * (t(x) @ t(wu).T)) @ t(wd).T
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-11)
    lin = nn.LinearV1.create(F64, None, 4, 6, Weight("w", F64, [6, 4], dev))
    assert type(lin) is nn.LinearV1
    from max.graph.quantization import QuantizationEncoding

    q = nn.LinearV1.create(F64, QuantizationEncoding.Q4_0, 32, 6, Weight("q", DType.uint8, [6, 18], dev))
    assert type(q) is nn.QLinearV1 and q.quantization_encoding is QuantizationEncoding.Q4_0
