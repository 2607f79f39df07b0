"""Module system: weight naming, state dicts, load_state_dict errors, hooks, sharing, subgraphs, call errors."""

from __future__ import annotations

import numpy as np
import pytest

from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, Weight, ops
from max.graph.quantization import QuantizationEncoding
from max.graph.weights import WeightData
from max import nn

from support import native_kernels, q8_activation_reference, run_graph, session, tt
from support import test_device_ref as dev_ref

F32 = DType.float32


class Block(nn.Module):
    def __init__(self, dim: int = 4) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(dim, F32)
        self.up = nn.Linear(dim, 2 * dim, F32, dev_ref())
        self.down = nn.Linear(2 * dim, dim, F32, dev_ref())

    def forward(self, x):
        return x + self.down(ops.relu(self.up(self.norm(x))))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4, F32, dev_ref())
        self.layers = nn.LayerList([Block(), Block()])
        self.out = nn.Linear(4, 10, F32, dev_ref())

    def forward(self, ids):
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


def random_state(module, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal([int(d) for d in w.shape]).astype(w.dtype.to_numpy())
            for k, w in module.raw_state_dict().items()}


def test_names_follow_attribute_paths_in_assignment_order():
    m = Model()
    names = list(m.raw_state_dict())
    assert names == ["embed.weight", "layers.0.norm.weight", "layers.0.up.weight", "layers.0.down.weight",
                     "layers.1.norm.weight", "layers.1.up.weight", "layers.1.down.weight", "out.weight"]
    # weights of attached sub-modules are renamed at once, so graphs can be built without state_dict()
    assert m.layers[1].up.weight.name == "layers.1.up.weight"
    assert list(m.sublayers) == ["embed", "layers", "out"]
    assert list(m.layers.sublayers) == ["0", "1"]
    assert list(m.layers[0].layer_weights) == [] and list(m.out.layer_weights) == ["weight"]
    assert [n for n, _ in nn.recursive_named_layers(m)] == [
        "", "embed", "layers", "layers.0", "layers.0.norm", "layers.0.up", "layers.0.down", "layers.1",
        "layers.1.norm", "layers.1.up", "layers.1.down", "out"]
    assert [n for n, _ in nn.recursive_named_layers(m.layers, prefix="model")][:2] == ["model", "model.0"]


def test_layer_list_is_a_list():
    ll = nn.LayerList([nn.Linear(2, 2, F32, dev_ref())])
    ll.append(nn.Linear(2, 3, F32, dev_ref()))
    ll.insert(0, nn.Linear(2, 4, F32, dev_ref()))
    ll.extend([nn.Linear(2, 5, F32, dev_ref())])
    assert len(ll) == 4 and [int(layer.out_dim) for layer in ll] == [4, 2, 3, 5]
    assert list(ll.raw_state_dict()) == ["0.weight", "1.weight", "2.weight", "3.weight"]
    assert ll[2].weight.name == "2.weight"


def test_named_root_layer_keys_its_weights_by_name():
    # MAX: name= names the weights (``lm_head.weight``), standalone and in the state dict
    lin = nn.Linear(3, 2, F32, dev_ref(), has_bias=True, name="lm_head")
    assert lin.weight.name == "lm_head.weight"
    assert list(lin.state_dict()) == ["lm_head.weight", "lm_head.bias"]
    assert lin.weight.name == "lm_head.weight"


def test_state_dict_zero_fills_and_auto_initialize_false_raises():
    m = Block()
    with pytest.raises(ValueError, match="norm.weight.*has no value"):
        m.state_dict(auto_initialize=False)
    sd = m.state_dict()
    assert all(isinstance(v, Buffer) for v in sd.values())  # MAX 26.7: Buffers (max-behaviours.md B16.3)
    assert all(not v.to_numpy().any() for v in sd.values())
    assert sd["up.weight"].shape == (8, 4) and sd["up.weight"].dtype == DType.float32
    again = m.state_dict(auto_initialize=False)["up.weight"]  # values are kept: the same memory
    assert np.shares_memory(again.to_numpy(), sd["up.weight"].to_numpy())


def test_load_state_dict_then_run_with_weights_registry():
    m = Model()
    sd = random_state(m)
    m.load_state_dict(sd)
    got = m.state_dict(auto_initialize=False)
    assert all(np.shares_memory(got[k].to_numpy(), sd[k]) for k in sd)
    ids = np.array([[1, 2, 9]], dtype=np.int64)
    (out,) = run_graph(lambda v: m(v), [tt(DType.int64, [1, "s"])], ids, weights=m.state_dict())
    # numpy reference
    h = sd["embed.weight"][ids]
    for i in range(2):
        p = f"layers.{i}."
        n = h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-6) * sd[p + "norm.weight"]
        h = h + np.maximum(n @ sd[p + "up.weight"].T, 0) @ sd[p + "down.weight"].T
    np.testing.assert_allclose(out, h @ sd["out.weight"].T, rtol=1e-5, atol=1e-5)


def test_load_state_dict_strict_errors():
    m = Block()
    sd = random_state(m)
    partial = {k: v for k, v in sd.items() if k != "up.weight"}
    with pytest.raises(ValueError, match=r"missing weights \['up.weight'\]"):
        m.load_state_dict(partial)
    with pytest.raises(ValueError, match=r"unused keys \['extra'\]"):
        m.load_state_dict({**sd, "extra": np.zeros(3, np.float32)})
    m.load_state_dict({**partial, "extra": np.zeros(3, np.float32)}, strict=False)  # tolerated
    with pytest.raises(ValueError, match="up.weight"):
        m.state_dict(auto_initialize=False)


def test_load_state_dict_shape_and_dtype_errors_name_the_weight():
    m = Block()
    sd = random_state(m)
    with pytest.raises(ValueError, match=r"^Value provided to weight 'up.weight' had different shape \(dim\[0\]: "
                       r"expected 8, got 4\)\."):
        m.load_state_dict({**sd, "up.weight": sd["up.weight"].T.copy()})
    with pytest.raises(ValueError, match=r"'down.weight' has dtype .*float64.*weight's dtype is .*float32"):
        m.load_state_dict({**sd, "down.weight": sd["down.weight"].astype(np.float64)})
    # a failed load sets nothing
    with pytest.raises(ValueError):
        m.state_dict(auto_initialize=False)


def test_load_state_dict_accepts_weightdata_torch_and_buffers():
    import torch
    from max.driver import Buffer

    m = Block()
    sd = random_state(m)
    mixed = {
        "norm.weight": WeightData.from_numpy(sd["norm.weight"], "norm.weight"),
        "up.weight": torch.from_numpy(sd["up.weight"]),
        "down.weight": Buffer.from_numpy(sd["down.weight"]),
    }
    m.load_state_dict(mixed)
    x = np.ones((2, 4), np.float32)
    (out,) = run_graph(lambda v: m(v), [tt(F32, [2, 4])], x, weights=m.state_dict())
    m2 = Block()
    m2.load_state_dict(sd)
    (ref,) = run_graph(lambda v: m2(v), [tt(F32, [2, 4])], x, weights=m2.state_dict())
    np.testing.assert_allclose(out, ref, rtol=1e-6)


def test_alignment_checks():
    lin = nn.Linear(4, 2, F32, dev_ref())
    raw = np.zeros(8 * 4 + 32, np.uint8)
    start = ((-raw.ctypes.data) % 16) + 2  # 2 bytes past a 16-byte boundary
    misaligned = np.ndarray((2, 4), np.float32, buffer=raw.data, offset=start)
    with pytest.raises(ValueError, match=r"^Found unaligned weight 'weight' \(expected alignment=4\)\."):
        lin.load_state_dict({"weight": misaligned})
    four = np.ndarray((2, 4), np.float32, buffer=raw.data, offset=start + 2)  # 4 mod 16
    lin.load_state_dict({"weight": four})  # the dtype's alignment (4) is enough by default
    with pytest.raises(ValueError, match=r"^Found unaligned weight .weight. \(expected alignment=16\)"):
        lin.load_state_dict({"weight": four}, weight_alignment=16)
    sixteen = np.ndarray((2, 4), np.float32, buffer=raw.data, offset=start + 14)
    lin.load_state_dict({"weight": sixteen}, weight_alignment=16)
    assert lin.weight.align == 16


def test_override_quantization_encoding():
    lin = nn.Linear(32, 2, F32, dev_ref())
    blocks = np.zeros((2, 18), np.uint8)
    wd = WeightData(blocks, "weight", DType.uint8, (2, 18), QuantizationEncoding.Q4_0)
    with pytest.raises(ValueError, match="quantization encoding"):
        lin.load_state_dict({"weight": wd})
    lin.load_state_dict({"weight": wd}, override_quantization_encoding=True)
    assert lin.weight.quantization_encoding is QuantizationEncoding.Q4_0
    assert lin.weight.dtype == DType.uint8 and [int(d) for d in lin.weight.shape] == [2, 18]


def test_wrong_rank_or_dtype_fails_at_the_call_with_the_layer_name():
    m = Model()
    with Graph("g", input_types=[tt(F32, [2, 4]), tt(DType.float64, [2, 4]), tt(F32, [2, 5]),
                                 tt(DType.float32, [2, 3])]) as g:
        f32, f64, wide, ids_bad = g.inputs
        with pytest.raises(TypeError, match=r"Linear 'layers.0.up': input has dtype .*float64, the layer's weights are .*float32"):
            m.layers[0].up(f64)
        with pytest.raises(ValueError, match=r"Linear 'out': last dim of input .* is 5, expected 4"):
            m.out(wide)
        with pytest.raises(TypeError, match=r"RMSNorm 'layers.1.norm'"):
            m.layers[1].norm(f64)
        with pytest.raises(TypeError, match=r"Embedding 'embed': indices must be int"):
            m.embed(ids_bad)
        with pytest.raises(ValueError, match=r"Conv2d: input must have rank 4"):  # checked before any conv op
            nn.Conv2d(3, 4, 4, F32, device=dev_ref())(f32)
        with pytest.raises(ValueError, match=r"GroupNorm: input .* has 4 channels"):
            nn.GroupNorm(2, 6, device=dev_ref())(f32)


def test_hooks_run_after_each_layer_and_can_replace_outputs():
    calls = []

    def record(layer, args, kwargs, outputs):
        calls.append(type(layer).__name__)
        return None

    def double_linear(layer, args, kwargs, outputs):
        return outputs * 2 if isinstance(layer, nn.Linear) else None

    m = Block()
    sd = random_state(m)
    m.load_state_dict(sd)
    x = np.ones((1, 4), np.float32)
    (plain,) = run_graph(lambda v: m(v), [tt(F32, [1, 4])], x, weights=m.state_dict())
    nn.add_layer_hook(record)
    nn.add_layer_hook(double_linear)
    try:
        (hooked,) = run_graph(lambda v: m(v), [tt(F32, [1, 4])], x, weights=m.state_dict())
    finally:
        nn.clear_hooks()
    assert calls == ["RMSNorm", "Linear", "Linear", "Block"]
    n = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * sd["norm.weight"]
    want = x + (np.maximum((n @ sd["up.weight"].T) * 2, 0) @ sd["down.weight"].T) * 2
    np.testing.assert_allclose(hooked, want, rtol=1e-5)
    calls.clear()
    run_graph(lambda v: m(v), [tt(F32, [1, 4])], x, weights=m.state_dict())
    assert calls == [] and not np.allclose(plain, hooked)


def test_hooks_run_once_for_super_call_and_for_v1_layers():
    seen = []
    nn.add_layer_hook(lambda layer, a, k, o: seen.append(type(layer).__name__))

    class Outer(nn.Linear):
        def __call__(self, x):
            return super().__call__(x)

    try:
        with Graph("g", input_types=[tt(F32, [1, 2])]) as g:
            Outer(2, 2, F32, dev_ref())(g.inputs[0])
            nn.LinearV1(ops.constant(np.eye(2, dtype=np.float32), F32, dev_ref()))(g.inputs[0])
    finally:
        nn.clear_hooks()
    assert seen == ["Outer", "LinearV1"]


def test_set_shared_weight_ties_without_duplicating():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(6, 4, F32, dev_ref())
            self.head = nn.Linear(4, 6, F32, dev_ref())
            self.head.set_shared_weight("weight", self.embed.weight)

        def forward(self, ids):
            return self.head(self.embed(ids))

    m = Tied()
    assert m.head.weight is m.embed.weight
    assert list(m.raw_state_dict()) == ["embed.weight"]
    assert "weight" not in m.head.layer_weights
    sd = random_state(m)
    m.load_state_dict(sd)
    ids = np.array([0, 3, 5], np.int64)
    (out,) = run_graph(lambda v: m(v), [tt(DType.int64, [3])], ids, weights=m.state_dict())
    w = sd["embed.weight"]
    np.testing.assert_allclose(out, w[ids] @ w.T, rtol=1e-5)


def test_same_weight_object_in_two_places_is_listed_once():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 2, F32, dev_ref())
            self.b = nn.Linear(2, 2, F32, dev_ref())
            self.b.weight = self.a.weight

    assert list(Two().raw_state_dict()) == ["a.weight"]


def test_spec_style_module_without_super_init():
    class Lin(nn.Module):
        def __init__(self, i, o):
            self.weight = Weight("weight", F32, (i, o), DeviceRef.CPU())

        def __call__(self, x):
            return x @ self.weight

    class Net(nn.Module):
        def __init__(self):
            self.up = Lin(3, 5)
            self.down = Lin(5, 3)

        def __call__(self, x):
            return self.down(ops.relu(self.up(x)))

    net = Net()
    sd = net.state_dict()
    assert list(sd) == ["up.weight", "down.weight"] and sd["up.weight"].shape == (3, 5)


def test_build_subgraph_with_weight_prefix_called_per_layer():
    m = Model()
    sd = random_state(m, seed=3)
    m.load_state_dict(sd)
    ids = np.array([[4, 1, 7, 7]], np.int64)
    (direct,) = run_graph(lambda v: m(v), [tt(DType.int64, [1, 4])], ids, weights=m.state_dict())

    def forward(v):
        h = m.embed(v)
        sub = m.layers[0].build_subgraph("block", [TensorType(F32, [1, 4, 4], dev_ref())],
                                         weight_prefix="layers.0.")
        for i in range(2):
            (h,) = ops.call(sub, h, prefix=f"layers.{i}.")
        return m.out(h)

    g = Graph("sub_test", forward, input_types=[tt(DType.int64, [1, 4])])
    assert "layers.0.up.weight" == m.layers[0].up.weight.name  # names restored after building
    sub_weights = set(g._subgraphs["block"].weights())
    assert sub_weights == {"norm.weight", "up.weight", "down.weight"}
    from support import to_input

    out = session().load(g, weights_registry=m.state_dict()).execute(to_input(ids))[0].to_numpy()
    np.testing.assert_allclose(out, direct, rtol=1e-5, atol=1e-6)


def test_build_subgraph_list_inputs_and_no_prefix():
    class Adder(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2, F32, dev_ref())

        def forward(self, xs):
            return self.lin(xs[0] + xs[1])

    a = Adder()
    a.load_state_dict({"lin.weight": np.eye(2, dtype=np.float32) * 3})
    t = TensorType(F32, [1, 2], dev_ref())

    def forward(x, y):
        sub = a.build_subgraph("adder", [[t, t]])
        return ops.call(sub, x, y)[0]

    g = Graph("lst", forward, input_types=[t, t])
    from support import to_input

    x = np.array([[1, 2]], np.float32)
    out = session().load(g, weights_registry=a.state_dict()).execute(to_input(x), to_input(x))[0].to_numpy()
    np.testing.assert_allclose(out, [[6, 12]])
    with pytest.raises(RuntimeError, match="no graph"):
        a.build_subgraph("x", [t])


def test_shardable_protocol_and_linear_shards():
    from max.graph.weight import ShardingStrategy

    lin = nn.Linear(4, 6, F32, dev_ref(), has_bias=True)
    assert isinstance(lin, nn.Shardable)
    lin.sharding_strategy = ShardingStrategy.rowwise(2)
    assert lin.sharding_strategy == ShardingStrategy.rowwise(2)
    shards = lin.shard([dev_ref(), dev_ref()])
    assert [int(s.weight.shape[0]) for s in shards] == [3, 3]
    rng = np.random.default_rng(9)
    w, b = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    lin.load_state_dict({"weight": w, "bias": b})
    x = rng.standard_normal((2, 4)).astype(np.float32)
    outs = run_graph(lambda v: [s(v) for s in shards], [tt(F32, [2, 4])], x, weights=lin.state_dict())
    np.testing.assert_allclose(np.concatenate(outs, -1), x @ w.T + b, rtol=1e-5, atol=1e-6)
    # columnwise: partial sums, bias added once
    lin2 = nn.Linear(4, 6, F32, dev_ref(), has_bias=True)
    lin2.load_state_dict({"weight": w, "bias": b})
    lin2.sharding_strategy = ShardingStrategy.columnwise(2)
    s2 = lin2.shard([dev_ref(), dev_ref()])
    outs = run_graph(lambda v: [s(v[:, 2 * i:2 * i + 2]) for i, s in enumerate(s2)], [tt(F32, [2, 4])], x,
                     weights=lin2.state_dict())
    np.testing.assert_allclose(outs[0] + outs[1], x @ w.T + b, rtol=1e-5, atol=1e-5)


def _q8_0_blocks(rng, rows, cols):
    """Random Q8_0 blocks (fp16 scale + 32 int8 per block) and their float values."""
    nb = cols // 32
    d = (rng.random((rows, nb)) * 0.1 + 0.01).astype(np.float16)
    q = rng.integers(-127, 128, (rows, nb, 32)).astype(np.int8)
    blocks = np.concatenate([d[..., None].view(np.uint8).reshape(rows, nb, 2), q.view(np.uint8)], -1)
    return blocks.reshape(rows, nb * 34), (d.astype(np.float32)[..., None] * q).reshape(rows, cols)


def test_quantized_linear_and_embedding_q8_0():
    if not hasattr(ops, "qmatmul"):
        pytest.skip("ops.qmatmul not available")
    rng = np.random.default_rng(11)
    lin = nn.Linear(64, 5, F32, dev_ref(), has_bias=True, quantization_encoding=QuantizationEncoding.Q8_0)
    assert lin.weight.dtype == DType.uint8 and [int(d) for d in lin.weight.shape] == [5, 68]
    blocks, wf = _q8_0_blocks(rng, 5, 64)
    b = rng.standard_normal(5).astype(np.float32)
    lin.load_state_dict({"weight": WeightData(blocks, "weight", DType.uint8, blocks.shape,
                                              QuantizationEncoding.Q8_0), "bias": b})
    x = rng.standard_normal((3, 64)).astype(np.float32)
    (out,) = run_graph(lambda v: lin(v), [tt(F32, [3, 64])], x, weights=lin.state_dict())
    ref = q8_activation_reference(x, wf) if native_kernels() else x.astype(np.float64) @ wf.T
    np.testing.assert_allclose(out, ref + b, rtol=1e-4, atol=1e-4)
    emb = nn.Embedding(5, 64, F32, dev_ref(), quantization_encoding=QuantizationEncoding.Q8_0)
    emb.load_state_dict({"weight": WeightData(blocks, "weight", DType.uint8, blocks.shape,
                                              QuantizationEncoding.Q8_0)})
    ids = np.array([[4, 0, 2]], np.int64)
    (out,) = run_graph(lambda v: emb(v), [tt(DType.int64, [1, 3])], ids, weights=emb.state_dict())
    np.testing.assert_allclose(out, wf[ids], rtol=1e-6)


def test_gptq_linear_and_limits(monkeypatch):
    """GPTQLinear: GPTQ rows (codes, float16 scales; group 64) with act-order perm_idx equal float64
    x @ W.T (+ b) on the weights they hold (by default through the packed native int4 kernels, with their
    8-bit activation codes; exactly in LIBREMAX_QMATMUL=exact); bad configs are named."""
    import torch

    from max.graph.quantization import QuantizationConfig
    from max.graph.quantization.gptq import pack_gptq_rows

    rng = np.random.default_rng(3)
    k, n = 128, 24
    codes, scales = rng.integers(0, 16, (n, k)), rng.uniform(0.01, 0.1, (n, k // 64)).astype(np.float16)
    perm = rng.permutation(k).astype(np.int32)
    stored = np.repeat(scales.astype(np.float64), 64, axis=1) * (codes - 8)
    w = np.empty_like(stored)
    w[:, perm] = stored
    b = rng.standard_normal(n).astype(np.float32)
    rows = pack_gptq_rows(torch.from_numpy(codes), torch.from_numpy(scales)).numpy()
    cfg = QuantizationConfig("gptq", 4, 64, desc_act=True, sym=True)
    gl = nn.GPTQLinear(k, n, F32, dev_ref(), has_bias=True, quantization_encoding=QuantizationEncoding.GPTQ,
                       quantization_config=cfg)
    assert list(gl.weight.shape) == [n, k // 2 + 2 * (k // 64)]
    gl.load_state_dict({"weight": WeightData(rows, "weight", DType.uint8, rows.shape, QuantizationEncoding.GPTQ),
                        "perm_idx": perm, "bias": b})
    x = rng.standard_normal((3, 5, k)).astype(np.float32)
    # default mode: the rows fold to Q4_0 at load and are packed for the native kernels (8-bit activations)
    g = Graph("gptq_default", lambda v: gl(v), input_types=[tt(F32, [3, 5, k])])
    model = session().load(g, weights_registry=gl.state_dict())
    if native_kernels():
        kinds = [nd.attrs["kinds"] for nd in model._prog.nodes if nd.op == "fused_matmul_t"]
        assert kinds == [("packed:Q4_0",)] and not any(nd.op == "gptq_to_q4_0" for nd in model._prog.nodes)
        want = q8_activation_reference(x[..., perm], stored) + b
    else:
        want = x.astype(np.float64) @ w.T + b
    np.testing.assert_allclose(model.execute(x)[0].to_numpy(), want, rtol=1e-4, atol=1e-4)
    monkeypatch.setenv("LIBREMAX_QMATMUL", "exact")
    (out,) = run_graph(lambda v: gl(v), [tt(F32, [3, 5, k])], x, weights=gl.state_dict())
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.T + b, rtol=1e-4, atol=1e-4)

    with pytest.raises(ValueError, match="quantization_config"):
        nn.GPTQLinear(32, 4, F32, dev_ref(), quantization_encoding=QuantizationEncoding.GPTQ)
    with pytest.raises(ValueError, match="group_size"):
        nn.GPTQLinear(96, 4, F32, dev_ref(), quantization_encoding=QuantizationEncoding.GPTQ,
                      quantization_config=QuantizationConfig("gptq", 4, 48))
    with pytest.raises(ValueError, match="float8_config is not supported"):
        nn.GPTQLinear(32, 4, F32, dev_ref(), float8_config=object())
    with Graph("g", input_types=[tt(F32, [1, 64]), tt(DType.uint8, [4, 33])]) as g:
        with pytest.raises(ValueError, match="33 bytes"):
            ops.qmatmul(QuantizationEncoding.GPTQ, QuantizationConfig("gptq", 4, 32), g.inputs[0], g.inputs[1])
        with pytest.raises(TypeError, match="QuantizationConfig"):
            ops.qmatmul(QuantizationEncoding.GPTQ, None, g.inputs[0], g.inputs[1])
        with pytest.raises(ValueError, match="quantization_config"):
            ops.dequantize(QuantizationEncoding.GPTQ, g.inputs[1])


def test_gptq_linear_float_path_and_distributed_gemm_config():
    rng = np.random.default_rng(10)
    gl = nn.GPTQLinear(3, 2, F32, dev_ref(), has_bias=True)
    w, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal(2).astype(np.float32)
    gl.load_state_dict({"weight": w, "bias": b})
    x = rng.standard_normal((4, 3)).astype(np.float32)
    (out,) = run_graph(lambda v: gl(v), [tt(F32, [4, 3])], x, weights=gl.state_dict())
    np.testing.assert_allclose(out, x @ w.T + b, rtol=1e-5, atol=1e-6)
    cfg = nn.DistributedGemmConfig.generate()
    assert isinstance(cfg, nn.DistributedGemmConfig) and cfg.enable_matmul_allreduce is False
    assert nn.DistributedGemmConfig(True).enable_matmul_allreduce
