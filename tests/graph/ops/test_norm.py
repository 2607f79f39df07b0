"""layer_norm against a float64 numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from max.dtype import DType
from max.graph import Graph, ops
from support import run1, run_graph, session, to_input, tt

shapes = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=6)


def _ref(x, gamma, beta, eps):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma.astype(np.float64) + beta.astype(np.float64)


@given(data=st.data())
def test_layer_norm_matches_numpy(data):
    shape = data.draw(shapes)
    dt = data.draw(st.sampled_from([DType.float32, DType.float64]))
    eps = data.draw(st.sampled_from([1e-6, 1e-5, 1e-3, 0.5]))
    npdt = dt.to_numpy()
    d = shape[-1]
    x = data.draw(hnp.arrays(npdt, shape, elements=st.floats(-10, 10, width=32)))
    g = data.draw(hnp.arrays(npdt, (d,), elements=st.floats(-2, 2, width=32)))
    b = data.draw(hnp.arrays(npdt, (d,), elements=st.floats(-2, 2, width=32)))
    out = run1(lambda a, gg, bb: ops.layer_norm(a, gg, bb, eps), [tt(dt, shape), tt(dt, [d]), tt(dt, [d])], x, g, b)
    assert out.dtype == npdt and out.shape == shape
    # tolerance: float32 rounding amplified by 1/sqrt(var + eps) for near-constant rows
    tol = 2e-3 if dt is DType.float32 else 1e-9
    np.testing.assert_allclose(out, _ref(x, g, b, eps), rtol=tol, atol=tol)


def test_layer_norm_constant_params_and_result_type():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    g = np.array([1.0, 2.0, 0.5, -1.0])  # float64 arrays become constants of the input's dtype
    b = np.array([0.0, 0.1, 0.2, 0.3])
    out = run1(lambda a: ops.layer_norm(a, g, b, 1e-5), [tt(DType.float32, [3, 4])], x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, _ref(x, g, b, 1e-5), rtol=1e-5, atol=1e-5)
    with Graph("types", input_types=[tt(DType.float32, [3, 4]), tt(DType.float64, [4])]) as gr:
        x_, g64 = (v.tensor for v in gr.inputs)
        y = ops.layer_norm(x_, g64, [0.0, 0.0, 0.0, 0.0], 1e-5)  # float64 gamma is cast to float32
        assert y.type == x_.type


@pytest.mark.parametrize("dt", [DType.float16, DType.bfloat16])
def test_layer_norm_half_precision(dt):
    import torch
    from max.driver import Buffer

    rng = np.random.default_rng(0)
    xt = torch.from_numpy(rng.standard_normal((3, 16)).astype(np.float32) * 3 + 1).to(dt.to_torch())
    g = rng.standard_normal(16).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    (out,) = run_graph(lambda a: ops.layer_norm(a, g, b, 1e-5).cast(DType.float32), [tt(dt, [3, 16])],
                       Buffer.from_dlpack(xt))
    gq = torch.from_numpy(g).to(dt.to_torch()).double().numpy()
    bq = torch.from_numpy(b).to(dt.to_torch()).double().numpy()
    want = _ref(xt.double().numpy(), gq, bq, 1e-5)
    tol = 2e-2 if dt is DType.float16 else 6e-2
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol)


def test_layer_norm_symbolic_dims():
    types = [tt(DType.float32, ["batch", "seq", "hidden"]), tt(DType.float32, ["hidden"]),
             tt(DType.float32, ["hidden"])]
    with Graph("sym_types", input_types=types) as gr:
        x, g, b = (v.tensor for v in gr.inputs)
        assert ops.layer_norm(x, g, b, 1e-5).shape == ["batch", "seq", "hidden"]

    graph = Graph("sym", lambda x, g, b: ops.layer_norm(x, g, b, 1e-5), input_types=types)
    model = session().load(graph)
    rng = np.random.default_rng(3)
    for n, s, h in ((1, 1, 2), (2, 3, 5), (4, 2, 8)):
        x = rng.standard_normal((n, s, h)).astype(np.float32)
        g = rng.standard_normal(h).astype(np.float32)
        b = rng.standard_normal(h).astype(np.float32)
        (out,) = model.execute(*(to_input(a) for a in (x, g, b)))
        np.testing.assert_allclose(out.to_numpy(), _ref(x, g, b, 1e-5), rtol=1e-4, atol=1e-4)


def _build(x_shape, g_shape, b_shape, eps=1e-5, dt=DType.float32, gdt=DType.float32):
    with Graph("err", input_types=[tt(dt, x_shape), tt(gdt, g_shape), tt(gdt, b_shape)]) as gr:
        x, g, b = (v.tensor for v in gr.inputs)
        return ops.layer_norm(x, g, b, eps)


def test_layer_norm_errors():
    with pytest.raises(ValueError, match=r"^Gamma size 3 does not match dimension of reduction 4\.$"):
        _build([2, 4], [3], [4])
    with pytest.raises(ValueError, match=r"^Beta size 5 does not match dimension of reduction 4\.$"):
        _build([2, 4], [4], [5])
    with pytest.raises(ValueError, match=r"^layer_norm: gamma has shape \[Dim\(1\), Dim\(4\)\], expected \[4\]"):
        _build([2, 4], [1, 4], [4])
    with pytest.raises(ValueError, match=r"^Gamma size h does not match dimension of reduction 4\."):
        _build([2, 4], ["h"], [4])
    for eps in (0.0, -1e-5):
        with pytest.raises(ValueError, match=r"^epsilon must be positive"):
            _build([2, 4], [4], [4], eps=eps)
    for eps in (float("nan"), float("inf")):  # MAX accepts these
        _build([2, 4], [4], [4], eps=eps)
    with pytest.raises(TypeError, match=r"^layer_norm: epsilon must be a float, got str"):
        _build([2, 4], [4], [4], eps="1e-5")
    with pytest.raises(TypeError, match=r"^layer_norm: input must be a float16/bfloat16/float32/float64 tensor, "
                                        r"got DType.int32"):
        _build([2, 4], [4], [4], dt=DType.int32)
    with pytest.raises(TypeError, match=r"^layer_norm: gamma must be a floating-point tensor, got DType.int64"):
        _build([2, 4], [4], [4], gdt=DType.int64)
    with pytest.raises(ValueError, match=r"^layer_norm: input must have rank >= 1"):
        _build([], [1], [1])
