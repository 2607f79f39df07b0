"""max.nn as of today's MAX: weight naming with ``name=`` (standalone and inside a parent), the
re-exports, Identity, MultiheadAttention, ConstantLayerNorm, StackedLinear, MoE/MoEGate.
References: float64 torch on the same weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from max import nn
from max.driver import Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, Graph, TensorType

CPU = DeviceRef.CPU()
F64 = DType.float64
rng = np.random.default_rng(0)


def run(module, input_types, *arrays, weights=None):
    g = Graph("t", module, input_types=input_types)
    sd = weights if weights is not None else module.state_dict()
    outs = InferenceSession().load(g, weights_registry=sd).execute(*[Buffer.from_numpy(a) for a in arrays])
    return [o.to_numpy() for o in outs]


def t(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


def test_name_gives_the_weights_their_names():
    lin = nn.Linear(3, 2, F64, CPU, has_bias=True, name="lin")
    assert sorted(lin.state_dict()) == ["lin.bias", "lin.weight"]
    emb = nn.Embedding(5, 3, F64, CPU, name="emb")
    assert list(emb.state_dict()) == ["emb"]
    # unnamed layers keep the attribute names
    assert sorted(nn.Linear(3, 2, F64, CPU, has_bias=True).state_dict()) == ["bias", "weight"]

    class Parent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 3, F64, CPU, name="left")
            self.b = nn.Linear(3, 3, F64, CPU)
            self.emb = nn.Embedding(5, 3, F64, CPU, name="table")

        def __call__(self, idx):
            return self.b(self.a(self.emb(idx)))

    p = Parent()
    keys = sorted(p.state_dict())
    assert keys == ["a.left.weight", "b.weight", "emb.table"]
    assert sorted(w.name for w in p.raw_state_dict().values()) == keys  # the graph's weight names too
    sd = {k: rng.standard_normal(v.shape) for k, v in p.state_dict().items()}
    p.load_state_dict(sd)
    idx = np.array([[0, 4], [2, 2]], np.int64)
    (out,) = run(p, [TensorType(DType.int64, [2, 2], CPU)], idx)
    want = t(sd["emb.table"])[idx] @ t(sd["a.left.weight"]).T @ t(sd["b.weight"]).T
    np.testing.assert_allclose(out, want.numpy(), rtol=1e-12)


def test_two_standalone_named_layers_share_a_graph_without_colliding():
    l1, l2 = nn.Linear(2, 2, F64, CPU, name="first"), nn.Linear(2, 2, F64, CPU, name="second")
    w1, w2 = rng.standard_normal((2, 2)), rng.standard_normal((2, 2))
    l1.load_state_dict({"first.weight": w1})
    l2.load_state_dict({"second.weight": w2})
    g = Graph("two", lambda x: l2(l1(x)), input_types=[TensorType(F64, [1, 2], CPU)])
    x = rng.standard_normal((1, 2))
    out = InferenceSession().load(g, weights_registry={**l1.state_dict(), **l2.state_dict()}).execute(
        Buffer.from_numpy(x))[0].to_numpy()
    np.testing.assert_allclose(out, x @ w1.T @ w2.T, rtol=1e-12)


def test_reexports():
    from max.nn.attention import AttentionWithRope, RaggedAttention
    from max.nn.kv_cache import KVCacheParams
    from max.nn.transformer import ReturnLogits, Transformer, TransformerBlock

    assert (nn.Transformer, nn.TransformerBlock, nn.ReturnLogits) == (Transformer, TransformerBlock, ReturnLogits)
    assert (nn.AttentionWithRope, nn.RaggedAttention, nn.KVCacheParams) == (AttentionWithRope, RaggedAttention,
                                                                             KVCacheParams)
    for name in ("Identity", "MultiheadAttention", "ConstantLayerNorm", "StackedLinear", "MoE", "MoEGate"):
        assert name in nn.__all__ and getattr(nn, name) is not None


def test_identity():
    x = rng.standard_normal((2, 3))
    ident = nn.Identity(4, anything=True)
    (out,) = run(ident, [TensorType(F64, [2, 3], CPU)], x, weights={})
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_multihead_attention_matches_torch(stacked, bias):
    heads, hidden = 4, 8
    mha = nn.MultiheadAttention(heads, hidden, dtype=F64, qkv_has_bias=bias, o_proj_has_bias=bias,
                                stacked_qkv=stacked)
    sd = {k: rng.standard_normal(v.shape) for k, v in mha.state_dict().items()}
    mha.load_state_dict(sd)
    if stacked:
        assert "qkv_proj.weight" in sd
        w_in = sd["qkv_proj.weight"]
        b_in = sd.get("qkv_proj.bias")
    else:
        w_in = np.concatenate([sd[f"{n}_proj.weight"] for n in "qkv"])
        b_in = np.concatenate([sd[f"{n}_proj.bias"] for n in "qkv"]) if bias else None
    x = rng.standard_normal((2, 5, hidden))
    (out,) = run(mha, [TensorType(F64, [2, 5, hidden], CPU)], x)
    want, _ = TF.multi_head_attention_forward(
        t(x).transpose(0, 1), t(x).transpose(0, 1), t(x).transpose(0, 1), hidden, heads, t(w_in),
        t(b_in) if b_in is not None else None, None, None, False, 0.0, t(sd["o_proj.weight"]),
        t(sd["o_proj.bias"]) if bias else None, need_weights=False)
    np.testing.assert_allclose(out, want.transpose(0, 1).numpy(), rtol=1e-10, atol=1e-12)


def test_multihead_attention_split_over_two_devices_equals_one():
    heads, hidden = 4, 8
    one = nn.MultiheadAttention(heads, hidden, dtype=F64)
    two = nn.MultiheadAttention(heads, hidden, devices=[CPU, CPU], dtype=F64)
    sd = {k: rng.standard_normal(v.shape) for k, v in one.state_dict().items()}
    one.load_state_dict(sd)
    two.load_state_dict(sd)
    x = rng.standard_normal((1, 3, hidden))
    ty = [TensorType(F64, [1, 3, hidden], CPU)]
    np.testing.assert_allclose(run(two, ty, x)[0], run(one, ty, x)[0], rtol=1e-12)
    with pytest.raises(ValueError, match="not divisible by num_attention_heads"):
        nn.MultiheadAttention(3, 8)


def test_constant_layer_norm():
    x = rng.standard_normal((2, 3, 4))
    ln = nn.ConstantLayerNorm((3, 4), CPU, F64, eps=1e-5)
    assert ln.state_dict() == {}
    (out,) = run(ln, [TensorType(F64, [2, 3, 4], CPU)], x)
    np.testing.assert_allclose(out, TF.layer_norm(t(x), (3, 4), eps=1e-5).numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("stacked", [False, True])
def test_stacked_linear(stacked):
    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv_proj = nn.StackedLinear(4, [4, 2, 2], ["q_proj", "k_proj", "v_proj"], F64, CPU,
                                             stacked=stacked, has_bias=True)

        def __call__(self, x):
            return self.qkv_proj(x)

    m = Attn()
    keys = sorted(m.state_dict())
    if stacked:
        assert keys == ["qkv_proj.bias", "qkv_proj.weight"]
    else:  # its own attribute name is left out: checkpoint names
        assert keys == ["k_proj.bias", "k_proj.weight", "q_proj.bias", "q_proj.weight", "v_proj.bias",
                        "v_proj.weight"]
    sd = {k: rng.standard_normal(v.shape) for k, v in m.state_dict().items()}
    m.load_state_dict(sd)
    x = rng.standard_normal((3, 4))
    (out,) = run(m, [TensorType(F64, [3, 4], CPU)], x)
    if stacked:
        want = x @ sd["qkv_proj.weight"].T + sd["qkv_proj.bias"]
    else:
        want = np.concatenate([x @ sd[f"{n}_proj.weight"].T + sd[f"{n}_proj.bias"] for n in "qkv"], -1)
    np.testing.assert_allclose(out, want, rtol=1e-12)
    with pytest.raises(ValueError, match="must be non-empty and of equal length"):
        nn.StackedLinear(4, [4, 2], ["q"], F64, CPU)


@pytest.mark.parametrize("first", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_moe_matches_torch(first, shared):
    hidden, n_exp, moe_dim = 6, 4, 5
    k = 1 if first else 2  # MAX applies the router weight first only with one expert per token (Llama-4)
    moe = nn.MoE([CPU], hidden, n_exp, k, moe_dim, dtype=F64, apply_router_weight_first=first,
                 has_shared_experts=shared, shared_experts_dim=3 if shared else 0)
    sd = {name: rng.standard_normal(v.shape) * 0.5 for name, v in moe.state_dict().items()}
    moe.load_state_dict(sd)
    assert "gate.gate_score.weight" in sd and "experts.3.down_proj.weight" in sd
    x = rng.standard_normal((7, hidden))
    (out,) = run(moe, [TensorType(F64, [7, hidden], CPU)], x)

    def mlp(p, v):
        return (TF.silu(v @ t(sd[f"{p}.gate_proj.weight"]).T) * (v @ t(sd[f"{p}.up_proj.weight"]).T)) \
            @ t(sd[f"{p}.down_proj.weight"]).T

    xt = t(x)
    probs = torch.softmax(xt @ t(sd["gate.gate_score.weight"]).T, -1)
    topw, topi = torch.topk(probs, k, -1)
    want = torch.zeros_like(xt)
    for tok in range(7):
        for w, e in zip(topw[tok], topi[tok]):
            v = xt[tok:tok + 1]
            want[tok] += (mlp(f"experts.{int(e)}", v * w) if first else mlp(f"experts.{int(e)}", v) * w)[0]
    if shared:
        want += mlp("shared_experts", xt)
    # router probabilities are float32 (~6e-8 relative): an absolute bound on the output scale
    np.testing.assert_allclose(out, want.numpy(), rtol=1e-6, atol=1e-6 * float(np.abs(want.numpy()).max()))
    gate = nn.MoEGate([CPU], hidden, n_exp, k, F64)
    with pytest.raises(ValueError, match="num_experts_per_token must be in"):
        nn.MoEGate([CPU], hidden, n_exp, 5, F64)
    assert sorted(gate.state_dict()) == ["gate_score.weight"]
