"""MAX 26.7 user-facing names of max.experimental (issue 37, /work/shared/max-behaviours.md)."""

import numpy as np
import pytest

from max.driver import CPU
from max.experimental.sharding import DeviceMesh


# ----------------------------------------------------------------------------- DeviceMesh
def test_device_mesh_single_repr_devices_equality():
    m = DeviceMesh.single(CPU())
    assert repr(m) == "DeviceMesh(_=1)"
    assert m.devices == (CPU(),)
    assert m == DeviceMesh.single(CPU())
    assert m == DeviceMesh((CPU(),), (1,), ("_",))
    assert m != DeviceMesh((CPU(),), (1,), ("tp",))
    assert m.is_single and m.is_simulated
    assert DeviceMesh.default() == m


def test_device_mesh_constructor_and_coords():
    m = DeviceMesh(tuple(CPU() for _ in range(6)), (2, 3), ("dp", "tp"))
    assert repr(m) == "DeviceMesh(dp=2, tp=3)"
    assert not m.is_single and m.is_simulated
    # row-major: flat index i has coords divmod(i, 3)
    for i in range(6):
        assert (m.device_coord(i, 0), m.device_coord(i, "tp")) == divmod(i, 3)
    assert m.axis_size("tp") == 3
    with pytest.raises(ValueError):
        m.axis_size("pp")
    with pytest.raises(ValueError):
        DeviceMesh((CPU(), CPU()), (3,), ("a",))


# ----------------------------------------------------------------------------- tensor defaults (B14.11-B14.15)
from max.driver import Buffer  # noqa: E402
from max.dtype import DType  # noqa: E402
from max.experimental import tensor as T  # noqa: E402
from max.graph import DeviceRef, TensorType  # noqa: E402


def test_B14_11_default_device_is_a_single_device_mesh():
    m = T._default_device()
    assert repr(m) == "DeviceMesh(_=1)"
    assert m.devices == (CPU(),)
    assert m == DeviceMesh.single(CPU())
    with T.default_device(CPU(1)):
        assert T._default_device().devices == (CPU(1),)
        assert T.Tensor.zeros([2]).device == CPU(1)
    assert T._default_device().devices == (CPU(),)


def test_B14_12_default_dtype_of_device_and_mesh():
    assert T._default_dtype(CPU()) == DType.float32
    assert T._default_dtype(DeviceMesh.single(CPU())) == DType.float32
    with T.default_dtype(DType.int32):
        assert T._default_dtype(CPU()) == DType.int32


def test_B14_13_defaults_returns_dtype_and_mesh():
    dtype, mesh = T.defaults(dtype=None, device=None)
    assert dtype == DType.float32 and isinstance(mesh, DeviceMesh) and mesh == DeviceMesh.single(CPU())
    assert T.defaults(DType.int8, CPU()) == (DType.int8, DeviceMesh.single(CPU()))
    with pytest.raises(TypeError):
        T.defaults("float32", None)


def test_B14_14_default_device_context_value_is_the_mesh():
    with T.default_device(CPU()) as d:
        assert d == DeviceMesh.single(CPU())
    with T.default_device(DeviceMesh.single(CPU())) as d:
        assert repr(d) == "DeviceMesh(_=1)"
        x = T.Tensor.ones([3])
        assert x.device == CPU()
    with T.default_dtype(DType.float64) as dt:
        assert dt == DType.float64


def test_B14_15_defaults_like_and_driver_tensor_type():
    x = T.Tensor.zeros([1], dtype=DType.int32, device=CPU())
    with T.defaults_like(x) as v:
        assert v is None
        y = T.Tensor.zeros((2, 3))
        z = T.Tensor.zeros((2, 3), dtype=DType.float32)
    assert (y.dtype, y.device) == (DType.int32, CPU())
    assert z.dtype == DType.float32
    with T.defaults_like(TensorType(DType.float64, [3], DeviceRef.CPU())):
        assert T.Tensor.ones([2]).dtype == DType.float64
    assert T.Tensor.ones([2]).dtype == DType.float32
    with pytest.raises(TypeError):
        with T.defaults_like(3):
            pass
    buf = Buffer.from_numpy(np.arange(6, dtype=np.int16).reshape(2, 3))
    assert T.driver_tensor_type(buf) == TensorType(DType.int16, [2, 3], DeviceRef.CPU())
    assert "defaults_like" in T.__all__ and "driver_tensor_type" in T.__all__


# ----------------------------------------------------------------------------- functional (MAX 26.7 names)
import torch  # noqa: E402

from max.experimental import functional as F  # noqa: E402
from max.experimental import sharding as S  # noqa: E402
from max.experimental.tensor import Tensor  # noqa: E402
from max.graph import Graph, ops  # noqa: E402


def test_B15_1_complex_mul_fact_and_reference():
    r = F.complex_mul(Tensor.ones([2, 2]), Tensor.ones([2, 1, 2]))
    assert list(r.shape) == [2, 2, 2]
    assert r.to_numpy().tolist() == [[[0.0, 2.0]] * 2] * 2
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 1, 4, 2)), rng.standard_normal((5, 1, 2))
    got = F.complex_mul(Tensor(a.astype(np.float32)), Tensor(b.astype(np.float32))).to_numpy()
    ref = (a[..., 0] + 1j * a[..., 1]) * (b[..., 0] + 1j * b[..., 1])
    np.testing.assert_allclose(got, np.stack([ref.real, ref.imag], -1), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="last dimension of size 2"):
        F.complex_mul(Tensor.ones([2, 3]), Tensor.ones([2, 2]))


def test_complex_mul_inside_a_graph():
    t = TensorType(DType.float32, [4, 2], DeviceRef.CPU())
    with Graph("cm", input_types=[t, t]) as g:
        out = F.complex_mul(*g.inputs)
        assert out.type == t


def test_elementwise_max_min_broadcast():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4,)).astype(np.float32)
    np.testing.assert_array_equal(F.elementwise_max(Tensor(a), Tensor(b)).to_numpy(), np.maximum(a, b))
    np.testing.assert_array_equal(F.elementwise_min(Tensor(a), Tensor(b)).to_numpy(), np.minimum(a, b))


def test_rebind_and_shape_to_tensor():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(F.rebind(Tensor(x), [2, 3]).to_numpy(), x)
    s = F.shape_to_tensor([2, 3, 7])
    assert s.dtype == DType.int64 and s.to_numpy().tolist() == [2, 3, 7]


def test_dequantize_matches_gguf_reference():
    gguf = pytest.importorskip("gguf")
    from gguf import quants

    from max.graph.quantization import QuantizationEncoding

    w = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    qb = quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    got = F.dequantize(QuantizationEncoding.Q8_0, Tensor(qb)).to_numpy()
    np.testing.assert_array_equal(got, quants.dequantize(qb, gguf.GGMLQuantizationType.Q8_0))


def test_random_names_in_functional():
    from max.experimental import random as R

    assert F.normal is R.normal and F.uniform_like is R.uniform_like
    g = F.gaussian([4000], mean=2.0, std=0.5, dtype=DType.float32, device=CPU()).to_numpy()
    assert g.shape == (4000,) and abs(g.mean() - 2.0) < 0.05 and abs(g.std() - 0.5) < 0.05
    u = F.uniform([4000], range=(-1, 3)).to_numpy()
    assert u.min() >= -1 and u.max() < 3 and abs(u.mean() - 1.0) < 0.1
    like = F.gaussian_like(TensorType(DType.float32, [2, 3], DeviceRef.CPU()))
    assert list(like.shape) == [2, 3]
    assert list(F.normal_like(TensorType(DType.float32, [5], DeviceRef.CPU())).shape) == [5]
    for n in ("gaussian", "gaussian_like", "normal", "normal_like", "uniform", "uniform_like", "complex_mul",
              "elementwise_max", "elementwise_min", "rebind", "shape_to_tensor", "dequantize", "reduce_scatter",
              "distributed_broadcast"):
        assert n in F.__all__ and callable(getattr(F, n))


def _mesh2():
    return DeviceMesh((CPU(), CPU()), (2,), ("tp",))


def test_reduce_scatter_sums_partials_and_shards():
    rng = np.random.default_rng(3)
    parts = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(2)]
    cells = np.empty((2,), dtype=object)
    for i, p in enumerate(parts):
        cells[i] = torch.from_numpy(p.copy())
    x = S.DistributedTensor(cells, S.PlacementMapping(_mesh2(), (S.Partial(),)))
    y = F.reduce_scatter(x, scatter_axis=0, mesh_axis="tp")
    assert y.placements == (S.Sharded(0),)
    total = parts[0] + parts[1]
    np.testing.assert_allclose(y.local_shards[0].to_numpy(), total[:2], rtol=1e-6)
    np.testing.assert_allclose(y.local_shards[1].to_numpy(), total[2:], rtol=1e-6)
    # ordinary tensor: one device, nothing to reduce or split
    t = Tensor(parts[0])
    assert F.reduce_scatter(t) is t
    with pytest.raises(ValueError):
        F.reduce_scatter(y, 0, 0)  # already sharded on that axis


def test_distributed_broadcast_copies_root_shard():
    a = np.arange(8, dtype=np.float32).reshape(4, 2)
    x = F.transfer_to(Tensor(a), S.PlacementMapping(_mesh2(), (S.Sharded(0),)))
    y = F.distributed_broadcast(x, mesh_axis=0, root=1)
    assert y.placements == (S.Replicated(),)
    for sh in y.local_shards:
        np.testing.assert_array_equal(sh.to_numpy(), a[2:])
    t = Tensor(a)
    assert F.distributed_broadcast(t) is t
    r = F.distributed_broadcast(t, mesh=_mesh2())
    assert r.placements == (S.Replicated(),) and len(r.local_shards) == 2
    for sh in r.local_shards:
        np.testing.assert_array_equal(sh.to_numpy(), a)
    with pytest.raises(ValueError):
        F.distributed_broadcast(x, root=2)


# ----------------------------------------------------------------------------- experimental.nn (MAX 26.7 names)
from max.experimental import nn as enn  # noqa: E402
from max.experimental.nn import module as enn_module  # noqa: E402


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_nn_norms_exported_and_match_numpy():
    x = _rand(3, 8)
    x64 = x.astype(np.float64)
    rms = enn.RMSNorm(8, eps=1e-6)
    rms.weight = Tensor(_rand(8, seed=1))
    ref = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * _rand(8, seed=1)
    np.testing.assert_allclose(rms(Tensor(x)).to_numpy(), ref, rtol=1e-5, atol=1e-5)
    g = enn.GemmaRMSNorm(8)
    g.weight = Tensor(_rand(8, seed=2))
    ref = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * (1 + _rand(8, seed=2))
    np.testing.assert_allclose(g(Tensor(x)).to_numpy(), ref, rtol=1e-5, atol=1e-5)
    ln = enn.LayerNorm(8)
    ref = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(ln(Tensor(x)).to_numpy(), ref, rtol=1e-4, atol=1e-5)
    gn = enn.GroupNorm(2, 4)
    xg = _rand(2, 4, 3)
    xr = xg.astype(np.float64).reshape(2, 2, 6)
    ref = ((xr - xr.mean(-1, keepdims=True)) / np.sqrt(xr.var(-1, keepdims=True) + 1e-5)).reshape(2, 4, 3)
    np.testing.assert_allclose(gn(Tensor(xg)).to_numpy(), ref, rtol=1e-4, atol=1e-5)
    for n in ("LayerNorm", "RMSNorm", "GemmaRMSNorm", "GroupNorm", "RotaryEmbedding", "TransposedRotaryEmbedding",
              "LoRA", "lora_layers", "lora_parameters", "PinnedDeviceTensor", "TransparentModule", "as_subgraph"):
        assert n in enn.__all__ and hasattr(enn, n)


def _rope_ref(x, start, base, interleaved):
    b, s, h, d = x.shape
    inv = base ** (-np.arange(0, d, 2) / d)
    ang = (np.arange(start, start + s)[:, None] * inv[None, :])[None, :, None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    x = x.astype(np.float64)
    if interleaved:
        a, c = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * cos - c * sin, a * sin + c * cos
        return out
    a, c = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([a * cos - c * sin, a * sin + c * cos], -1)


@pytest.mark.parametrize("cls,interleaved", [("RotaryEmbedding", True), ("TransposedRotaryEmbedding", False)])
def test_nn_rotary_embeddings_match_numpy(cls, interleaved):
    from max.experimental.nn.rope import positional_embedding

    x = _rand(2, 5, 3, 8)
    rope = getattr(enn, cls)(positional_embedding(8, base=10000.0, max_sequence_length=16, dtype=DType.float32))
    np.testing.assert_allclose(rope(Tensor(x), start_pos=3).to_numpy(), _rope_ref(x, 3, 10000.0, interleaved),
                               rtol=1e-5, atol=1e-5)


def test_lora_forward_matches_numpy_and_names():
    base = enn.Linear(6, 4)
    lora = enn.LoRA(base, rank=2, alpha=4.0)
    assert float(np.abs(lora.lora_B.to_numpy()).max()) == 0.0  # a fresh adapter changes nothing
    x = _rand(3, 6)
    np.testing.assert_allclose(lora(Tensor(x)).to_numpy(), base(Tensor(x)).to_numpy(), rtol=1e-6)
    lora.lora_B = Tensor(_rand(4, 2, seed=5))
    w, b = base.weight.to_numpy().astype(np.float64), base.bias.to_numpy().astype(np.float64)
    a_, b_ = lora.lora_A.to_numpy().astype(np.float64), lora.lora_B.to_numpy().astype(np.float64)
    ref = x @ w.T + b + (4.0 / 2) * (x @ a_.T) @ b_.T
    np.testing.assert_allclose(lora(Tensor(x)).to_numpy(), ref, rtol=1e-5, atol=1e-5)
    # transparent: the base parameters keep their names, so a plain checkpoint loads
    assert sorted(n for n, _ in lora.parameters) == ["bias", "lora_A", "lora_B", "weight"]
    model = enn.Sequential(enn.LoRA(enn.Linear(6, 4), 1), enn.Linear(4, 2), enn.LoRA(enn.Linear(2, 2), 1))
    assert [n for n, _ in enn.lora_layers(model)] == ["0", "2"]
    assert [n for n, _ in enn.lora_parameters(model)] == ["0.lora_A", "0.lora_B", "2.lora_A", "2.lora_B"]
    plain = enn.Sequential(enn.Linear(6, 4), enn.Linear(4, 2), enn.Linear(2, 2))
    model.load_state_dict({**dict(plain.parameters), **dict(enn.lora_parameters(model))})
    np.testing.assert_array_equal(model[0].module.weight.to_numpy(), plain[0].weight.to_numpy())
    with pytest.raises(ValueError):
        enn.LoRA(enn.Linear(2, 2), 0)


def test_lora_names_below_transparent_wrappers():
    class Block(enn.Module):
        def __init__(self):
            self.proj = enn.LoRA(enn.Linear(3, 3), 1)

        def forward(self, x):
            return self.proj(x)

    model = enn.Sequential(enn.TransparentModule(Block()), Block())
    params = [n for n, _ in model.parameters]
    assert "0.proj.lora_A" in params and "1.proj.weight" in params
    assert [n for n, _ in enn.lora_layers(model)] == ["0.proj", "1.proj"]
    assert [n for n, _ in enn.lora_parameters(model)] == ["0.proj.lora_A", "0.proj.lora_B", "1.proj.lora_A",
                                                          "1.proj.lora_B"]


def test_transparent_module_forwards_and_flattens_names():
    inner = enn.Linear(3, 2)
    t = enn.TransparentModule(inner)
    x = _rand(4, 3)
    np.testing.assert_array_equal(t(Tensor(x)).to_numpy(), inner(Tensor(x)).to_numpy())
    assert [n for n, _ in t.parameters] == [n for n, _ in inner.parameters]
    with pytest.raises(TypeError):
        enn.TransparentModule(3)


def test_B14_18_pinned_device_tensor(monkeypatch):
    import typing

    P = enn_module.PinnedDeviceTensor
    assert typing.get_origin(P) is typing.Annotated and typing.get_args(P)[0] is Tensor
    marker = typing.get_args(P)[1]
    assert marker.__name__ == "_DevicePinned" and vars(marker).keys() <= {"__module__", "__doc__", "__dict__",
                                                                          "__weakref__", "__qualname__"}
    t = P([1.0, 2.0])
    assert type(t) is Tensor and t.to_numpy().tolist() == [1.0, 2.0]

    @enn.module_dataclass
    class Scaled(enn.Module):
        weight: Tensor
        scale: enn.PinnedDeviceTensor

        def forward(self, x):
            return x * self.weight * self.scale

    class Outer(enn.Module):
        def __init__(self):
            self.inner = Scaled(weight=Tensor([1.0, 2.0]), scale=Tensor([3.0, 4.0]))
            self.bias = Tensor([0.5, 0.5])

    class Sub(Scaled):
        pass

    m = Scaled(weight=Tensor([1.0, 2.0]), scale=Tensor([3.0, 4.0]))
    assert [n for n, _ in m.parameters] == ["weight", "scale"]
    assert m.to(CPU()) is m
    # Module.to moves every tensor but the pinned ones, in children and subclasses too
    moved = []
    orig = Tensor.to

    def spy(self, device):
        moved.append(id(self))
        return orig(self, device)

    monkeypatch.setattr(Tensor, "to", spy)
    o = Outer()
    ids = {n: id(t) for n, t in o.parameters}
    o.to(CPU())
    assert ids["inner.scale"] not in moved and ids["inner.weight"] in moved and ids["bias"] in moved
    s = Sub(weight=Tensor([1.0]), scale=Tensor([2.0]))
    moved.clear()
    sid = id(s.scale)
    s.to(CPU())
    assert sid not in moved and len(moved) == 1


class _Block(enn.Module):
    def __init__(self, seed):
        self.lin = enn.Linear(4, 4)
        self.lin.weight = Tensor(_rand(4, 4, seed=seed))

    def forward(self, x):
        return x + F.relu(self.lin(x))


class _Net(enn.Module):
    def __init__(self, blocks):
        self.layers = enn.ModuleList(blocks)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_as_subgraph_shares_one_body_and_keeps_each_layers_weights():
    blocks = [enn.as_subgraph(_Block(i)) for i in range(3)]
    net = _Net(blocks)
    x = _rand(2, 4, seed=9)
    ref = x.astype(np.float64)
    for b in blocks:
        w, bias = b.lin.weight.to_numpy().astype(np.float64), b.lin.bias.to_numpy().astype(np.float64)
        ref = ref + np.maximum(ref @ w.T + bias, 0)
    np.testing.assert_allclose(net(Tensor(x)).to_numpy(), ref, rtol=1e-5, atol=1e-5)  # eager: plain forward
    cm = net.compile(TensorType(DType.float32, [2, 4], DeviceRef.CPU()))
    assert len(cm.graph._subgraphs) == 1
    out = cm(Tensor(x))
    out = out[0] if isinstance(out, (list, tuple)) else out
    np.testing.assert_allclose(out.to_numpy(), ref, rtol=1e-5, atol=1e-5)


def test_as_subgraph_class_decorator_and_name():
    @enn.as_subgraph(name="blk")
    class Named(_Block):
        pass

    class Plain(_Block):
        pass

    assert enn.as_subgraph(Plain) is Plain
    net = _Net([Named(i) for i in range(2)])
    cm = net.compile(TensorType(DType.float32, [3, 4], DeviceRef.CPU()))
    assert list(cm.graph._subgraphs) == ["blk"]
    with pytest.raises(TypeError):
        enn.as_subgraph(3)
