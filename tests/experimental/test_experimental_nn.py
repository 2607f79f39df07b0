"""max.experimental.nn: the Module tree (names, parameters, children, load/map/apply, to, repr),
module_dataclass, ModuleList/Sequential, Linear/Embedding/Conv2d, norms and rope against float64
torch, and the same forward run eagerly, traced inside a Graph and compiled."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from hypothesis import given
from hypothesis import strategies as st

from max.driver import CPU, Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.experimental import functional as F
from max.experimental.nn import (
    CompiledModel,
    Conv2d,
    Embedding,
    Linear,
    Module,
    ModuleList,
    Sequential,
    module_dataclass,
)
from max.experimental.nn.norm import GemmaRMSNorm, GroupNorm, LayerNorm, RMSNorm, rms_norm
from max.experimental.nn.rope import RotaryEmbedding, TransposedRotaryEmbedding, positional_embedding
from max.experimental.tensor import Tensor
from max.graph import DeviceRef, Graph, TensorType

CPU_ = CPU()
rng = np.random.default_rng(0)


def t64(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


class MLP(Module):
    def __init__(self, d_in: int, d_hidden: int, d_out: int) -> None:
        self.up = Linear(d_in, d_hidden, dtype=DType.float64, device=CPU_)
        self.down = Linear(d_hidden, d_out, bias=False, dtype=DType.float64, device=CPU_)
        self.scale = 2.0

    def forward(self, x):
        return self.down(F.relu(self.up(x))) * self.scale


class Stack(Module):
    def __init__(self) -> None:
        self.layers = ModuleList([MLP(4, 8, 4), MLP(4, 8, 4)])
        self.norm = RMSNorm(4, dtype=DType.float64, device=CPU_)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return self.norm(x)


def _torch_stack(m: Stack, x: np.ndarray) -> np.ndarray:
    sd = {k: torch.from_numpy(np.asarray(v)) for k, v in m.parameters}
    h = t64(x)
    for i in range(2):
        u = h @ sd[f"layers.{i}.up.weight"].T + sd[f"layers.{i}.up.bias"]
        h = h + (torch.relu(u) @ sd[f"layers.{i}.down.weight"].T) * 2.0
    return (h / torch.sqrt((h * h).mean(-1, keepdim=True) + 1e-6) * sd["norm.weight"]).numpy()


def test_tree_names_and_state():
    m = Stack()
    names = [n for n, _ in m.parameters]
    assert names == ["layers.0.up.weight", "layers.0.up.bias", "layers.0.down.weight",
                     "layers.1.up.weight", "layers.1.up.bias", "layers.1.down.weight", "norm.weight"]
    assert [n for n, _ in m.children] == ["layers", "norm"]
    assert [n for n, _ in m.layers.children] == ["0", "1"]
    assert "layers.1.up" in [n for n, _ in m.descendants]
    assert [n for n, _ in m.norm.local_parameters] == ["weight"]
    r = repr(m)  # rich's pretty form (max-behaviours.md B16.2)
    assert r.startswith("Stack(\n    layers=ModuleList(\n        MLP(\n") and "scale=2.0" in r
    assert "\n    norm=RMSNorm(" in r and r.endswith("\n)")


def test_eager_traced_and_compiled_forward_agree_with_torch():
    m = Stack()
    x = rng.standard_normal((3, 4))
    want = _torch_stack(m, x)
    np.testing.assert_allclose(m(Tensor(x)).to_numpy(), want, rtol=1e-12, atol=1e-12)
    ty = TensorType(DType.float64, ["batch", 4], DeviceRef.CPU())
    g = Graph("traced", m, input_types=[ty])  # the same forward traced into a Graph
    out = InferenceSession().load(g).execute(Buffer.from_numpy(x))[0].to_numpy()
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    c = m.compile(ty)
    assert isinstance(c, CompiledModel)
    np.testing.assert_allclose(c(Tensor(x)).to_numpy(), want, rtol=1e-12, atol=1e-12)
    x5 = rng.standard_normal((5, 4))
    np.testing.assert_allclose(c(x5).to_numpy(), _torch_stack(m, x5), rtol=1e-12, atol=1e-12)
    assert sorted(c.graph.weights()) == sorted(n for n, _ in m.parameters)  # parameters are weights
    # compile with other weights: no retrace of the module's own values
    other = {n: np.zeros(np.asarray(t).shape) for n, t in m.parameters}
    c0 = m.compile(ty, weights=other)
    np.testing.assert_array_equal(c0(Tensor(x)).to_numpy(), np.zeros((3, 4)))
    with pytest.raises(KeyError, match="no parameter named"):
        m.compile(ty, weights={"nope": np.zeros(2)})
    with pytest.raises(TypeError, match="compile: input_types\\[0\\] must be a graph Type"):
        m.compile([3, 4])


def test_traced_tensors_have_no_data():
    class Peek(Module):
        def forward(self, x):
            return x.item()

    with pytest.raises(ValueError, match="its values exist only when the compiled model runs"):
        Peek().compile(TensorType(DType.float32, [1], DeviceRef.CPU()))


def test_load_state_dict_and_to():
    m = Stack()
    sd = {n: rng.standard_normal(np.asarray(t).shape) for n, t in m.parameters}
    m.load_state_dict(sd)
    for n, t in m.parameters:
        np.testing.assert_array_equal(t.to_numpy(), sd[n])
    with pytest.raises(KeyError, match="missing keys \\['norm.weight'\\]"):
        m.load_state_dict({k: v for k, v in sd.items() if k != "norm.weight"})
    with pytest.raises(KeyError, match="unexpected keys \\['extra'\\]"):
        m.load_state_dict({**sd, "extra": np.zeros(1)})
    m.load_state_dict({"norm.weight": np.ones(4)}, strict=False)
    with pytest.raises(ValueError, match="'norm.weight' has shape \\[4\\], the new value \\[5\\]"):
        m.load_state_dict({"norm.weight": np.ones(5)}, strict=False)
    with pytest.raises(ValueError, match="has dtype DType.float64, the new value DType.float32"):
        m.load_state_dict({"norm.weight": np.ones(4, np.float32)}, strict=False)
    m.load_state_dict({"norm.weight": np.full(4, 2, np.float32)}, strict=False, auto_cast=True)
    assert m.norm.weight.dtype is DType.float64
    np.testing.assert_array_equal(m.norm.weight.to_numpy(), np.full(4, 2.0))
    assert m.to(CPU_) is m and m.device == CPU_


def test_module_dataclass_and_sequential():
    @module_dataclass
    class Affine(Module):
        weight: Tensor
        bias: Tensor

        def forward(self, x):
            return x @ self.weight.T + self.bias

    a = Affine(weight=Tensor(rng.standard_normal((2, 3))), bias=Tensor(rng.standard_normal(2)))
    assert [n for n, _ in a.parameters] == ["weight", "bias"]
    seq = Sequential(a, Affine(weight=Tensor(rng.standard_normal((4, 2))), bias=Tensor(rng.standard_normal(4))))
    assert [n for n, _ in seq.parameters] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    x = rng.standard_normal((5, 3)).astype(np.float32)
    sd = {k: t64(v) for k, v in seq.parameters}
    want = (t64(x) @ sd["0.weight"].T + sd["0.bias"]) @ sd["1.weight"].T + sd["1.bias"]
    np.testing.assert_allclose(seq(Tensor(x)).to_numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="must subclass max.experimental.nn.Module"):
        module_dataclass(type("Plain", (), {"__annotations__": {"w": int}}))
    with pytest.raises(TypeError, match="entry 0 is a int, not a Module"):
        ModuleList([1])


@given(n=st.integers(1, 4), d_in=st.integers(1, 5), d_out=st.integers(1, 5), bias=st.booleans())
def test_linear_matches_torch(n, d_in, d_out, bias):
    lin = Linear(d_in, d_out, bias=bias, dtype=DType.float64, device=CPU_)
    w = lin.weight.to_numpy()
    assert w.shape == (d_out, d_in) and np.abs(w).max() <= 1 / np.sqrt(d_in)
    x = rng.standard_normal((n, d_in))
    want = TF.linear(t64(x), t64(w), t64(lin.bias.to_numpy()) if bias else None).numpy()
    np.testing.assert_allclose(lin(Tensor(x)).to_numpy(), want, rtol=1e-12, atol=1e-12)


def test_embedding_and_conv2d_match_torch():
    e = Embedding(7, dim=3, dtype=DType.float64, device=CPU_)
    idx = np.array([[0, 6], [3, 3]], np.int64)
    np.testing.assert_array_equal(e(Tensor(idx)).to_numpy(), e.weight.to_numpy()[idx])
    assert (e.vocab_size, e.dim) == (7, 3)
    with pytest.raises(ValueError, match="give exactly one of dim= and dims="):
        Embedding(4)
    x = rng.standard_normal((2, 6, 5, 4))  # NHWC
    for permute in (False, True):
        conv = Conv2d(3, 4, 6, dtype=DType.float64, device=CPU_, padding=1, stride=(1, 2), has_bias=True,
                      permute=permute)
        w = conv.weight.to_numpy()
        w_torch = w if permute else w.transpose(3, 2, 0, 1)  # RSCF -> FCRS
        want = TF.conv2d(t64(x).permute(0, 3, 1, 2), t64(w_torch), t64(conv.bias.to_numpy()), stride=(1, 2),
                         padding=1).permute(0, 2, 3, 1).numpy()
        np.testing.assert_allclose(conv(Tensor(x)).to_numpy(), want, rtol=1e-10, atol=1e-10)


def test_norms_match_torch():
    x = rng.standard_normal((2, 6, 3))
    w = rng.standard_normal(3)
    r = RMSNorm(3, dtype=DType.float64, device=CPU_)
    r.load_state_dict({"weight": w})
    want = (t64(x) / torch.sqrt((t64(x) ** 2).mean(-1, keepdim=True) + 1e-6) * t64(w)).numpy()
    np.testing.assert_allclose(r(Tensor(x)).to_numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(rms_norm(Tensor(x), Tensor(w), 1e-6).to_numpy(), want, rtol=1e-12)
    gm = GemmaRMSNorm(3, dtype=DType.float64, device=CPU_)
    gm.load_state_dict({"weight": w})
    np.testing.assert_allclose(gm(Tensor(x)).to_numpy(), want / w * (1 + w), rtol=1e-10)
    ln = LayerNorm(3, dtype=DType.float64, device=CPU_)
    ln.load_state_dict({"weight": w, "bias": w * 0.5})
    np.testing.assert_allclose(ln(Tensor(x)).to_numpy(),
                               TF.layer_norm(t64(x), (3,), t64(w), t64(w * 0.5), 1e-5).numpy(), rtol=1e-10)
    assert [n for n, _ in LayerNorm(3, elementwise_affine=False).parameters] == []
    gn = GroupNorm(2, 6, dtype=DType.float64, device=CPU_)
    gn.load_state_dict({"weight": np.arange(6.0), "bias": np.ones(6)})
    np.testing.assert_allclose(gn(Tensor(x)).to_numpy(),
                               TF.group_norm(t64(x), 2, t64(np.arange(6.0)), t64(np.ones(6)), 1e-5).numpy(),
                               rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="divisible by num_groups"):
        GroupNorm(4, 6)


def _torch_rope(x, start, base, interleaved):
    b, s, h, d = x.shape
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(start, start + s, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cos(ang)[None, :, None, :], torch.sin(ang)[None, :, None, :]
    if interleaved:
        xc = torch.view_as_complex(x.reshape(b, s, h, d // 2, 2).contiguous())
        return torch.view_as_real(xc * torch.polar(torch.ones_like(ang), ang)[None, :, None, :]).reshape(x.shape)
    a, bb = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([a * cos - bb * sin, a * sin + bb * cos], -1)


@pytest.mark.parametrize("cls,interleaved", [(RotaryEmbedding, True), (TransposedRotaryEmbedding, False)])
def test_rope_matches_torch(cls, interleaved):
    table = positional_embedding(8, 10000.0, 32, dtype=DType.float64, device=CPU_)
    rope = cls(weight=table)
    assert rope.dim == 8
    x = rng.standard_normal((2, 5, 3, 8))
    for start in (0, 7):
        np.testing.assert_allclose(rope(Tensor(x), start_pos=start).to_numpy(),
                                   _torch_rope(t64(x), start, 10000.0, interleaved).numpy(), rtol=1e-10,
                                   atol=1e-12)
    with pytest.raises(ValueError, match="weight must be \\[max_sequence_length, head_dim // 2, 2\\]"):
        cls(weight=Tensor.zeros([4, 4]))
