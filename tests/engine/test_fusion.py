"""Pattern fusion changes no result beyond float tolerance, and only fires when it may."""

from __future__ import annotations

import math

import numpy as np
import pytest

from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, Graph, TensorType, ops

CPU = DeviceRef.CPU()


def _run_both(build, *arrays):
    outs = {}
    stats = {}
    for lvl in (0, 1):
        s = InferenceSession(optimization_level=lvl)
        m = s.load(build())
        outs[lvl] = [o.to_numpy() for o in m.execute(*arrays)]
        stats[lvl] = s.last_compile_stats.get("fused", {})
    for a, b in zip(outs[0], outs[1]):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    assert not stats[0]
    return stats[1]


rng = np.random.default_rng(0)


@pytest.mark.parametrize("act", [None, "relu", "gelu", "silu"])
def test_linear_bias_act(act):
    def build():
        with Graph("lin", input_types=[TensorType(DType.float32, ("b", 8), CPU), TensorType(DType.float32, (8, 5), CPU),
                                       TensorType(DType.float32, (5,), CPU)]) as g:
            x, w, b = g.inputs
            y = x @ w + b
            g.output(getattr(ops, act)(y) if act else y)
        return g

    st = _run_both(build, rng.standard_normal((3, 8), np.float32), rng.standard_normal((8, 5), np.float32),
                   rng.standard_normal(5).astype(np.float32))
    assert st == {"fused_linear": 1}


def test_swiglu_and_rms_norm():
    def build():
        with Graph("mlp", input_types=[TensorType(DType.float32, (2, 3, 8), CPU), TensorType(DType.float32, (8,), CPU),
                                       TensorType(DType.float32, (8, 16), CPU), TensorType(DType.float32, (8, 16), CPU)]) as g:
            x, nw, w1, w3 = g.inputs
            h = x * ops.rsqrt(ops.mean(x * x, axis=-1) + 1e-6) * nw
            g.output(ops.silu(h @ w1) * (h @ w3))
        return g

    st = _run_both(build, rng.standard_normal((2, 3, 8), np.float32), rng.standard_normal(8).astype(np.float32),
                   rng.standard_normal((8, 16), np.float32), rng.standard_normal((8, 16), np.float32))
    assert st == {"fused_rms_norm": 1, "fused_swiglu": 1}


@pytest.mark.parametrize("with_mask", [False, True])
def test_attention_to_sdpa(with_mask):
    S, D = 6, 4

    def build():
        types = [TensorType(DType.float32, (2, 3, S, D), CPU)] * 3 + [TensorType(DType.float32, (S, S), CPU)]
        with Graph("attn", input_types=types) as g:
            q, k, v, mask = g.inputs
            s = q @ ops.transpose(k, -1, -2) * (1 / math.sqrt(D))
            if with_mask:
                s = s + mask
            g.output(ops.softmax(s) @ v)
        return g

    mask = np.triu(np.full((S, S), -1e9, np.float32), 1)
    args = [rng.standard_normal((2, 3, S, D), np.float32) for _ in range(3)] + [mask]
    st = _run_both(build, *args)
    assert st == {"fused_attention": 1}


def test_no_fusion_when_intermediate_is_shared():
    def build():
        with Graph("shared", input_types=[TensorType(DType.float32, (2, 4), CPU), TensorType(DType.float32, (4, 4), CPU),
                                          TensorType(DType.float32, (4,), CPU)]) as g:
            x, w, b = g.inputs
            mm = x @ w
            g.output(ops.relu(mm + b), mm)  # matmul result used twice
        return g

    st = _run_both(build, rng.standard_normal((2, 4), np.float32), rng.standard_normal((4, 4), np.float32),
                   rng.standard_normal(4).astype(np.float32))
    assert st == {}


def test_bad_optimization_level():
    with pytest.raises(ValueError, match="optimization_level must be 0, 1 or 2"):
        InferenceSession(optimization_level=5)



def _weighted(name, arrays, k, m, body):
    """A graph of ``body(x, weights)`` whose weights are named graph weights (as a model's are)."""
    from max.graph import Weight

    with Graph(name, input_types=[TensorType(DType.float32, (m, k), CPU)]) as g:
        ws = {n: Weight(n, DType.float32, a.shape, CPU) for n, a in arrays.items()}
        out = body(g.inputs[0], ws)
        g.output(*out) if isinstance(out, tuple) else g.output(out)
    return g


def _rms(x, g, eps):
    return x * ops.rsqrt(ops.mean(x * x, axis=-1) + eps) * g


@pytest.mark.parametrize("glu", [False, True])
@pytest.mark.parametrize("m", [1, 5])
def test_rms_norm_folds_into_the_projection_that_reads_it(glu, m):
    """``P(rms_norm(h))`` is one fused_matmul_t that normalises ``h`` itself."""
    k, n = 64, 48
    arrays = {"g": rng.standard_normal(k).astype(np.float32),
              "w1": (rng.standard_normal((n, k)) / 8).astype(np.float32),
              "w2": (rng.standard_normal((n, k)) / 8).astype(np.float32)}

    def body(x, w):
        h = _rms(x, w["g"], 1e-5)
        p1 = h @ w["w1"].T
        return ops.silu(p1) * (h @ w["w2"].T) if glu else p1

    x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
    s = InferenceSession()
    (out,) = s.load(_weighted("prenorm", arrays, k, m, body), weights_registry=arrays).execute(x)
    x64 = x.astype(np.float64)
    h = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-5) * arrays["g"]
    want = h @ arrays["w1"].T.astype(np.float64)
    if glu:
        want = want / (1 + np.exp(-want)) * (h @ arrays["w2"].T.astype(np.float64))
    np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-4, atol=1e-4)
    assert s.last_compile_stats["fused"].get("fused_matmul_t+prenorm") == 1, s.last_compile_stats


def test_shared_rms_norm_is_not_folded():
    """A norm whose output is also a graph output stays its own op."""
    k = 32
    arrays = {"g": rng.standard_normal(k).astype(np.float32), "w1": rng.standard_normal((16, k)).astype(np.float32)}

    def body(x, w):
        h = _rms(x, w["g"], 1e-6)
        return h @ w["w1"].T, h

    s = InferenceSession()
    s.load(_weighted("shared", arrays, k, 2, body), weights_registry=arrays)
    fused = s.last_compile_stats["fused"]
    assert fused.get("fused_rms_norm") == 1 and "fused_matmul_t+prenorm" not in fused, fused


def test_level_2_runs_through_torch_compile_and_falls_back_when_dynamo_fails(monkeypatch):
    """Level 2 gives the same result as level 1; when TorchDynamo cannot compile the graph the model
    warns once and runs uncompiled instead of failing the request."""
    import torch
    import torch._dynamo.exc as dexc

    def build():
        with Graph("l2", input_types=[TensorType(DType.float32, (4, 8), CPU)]) as g:
            (x,) = g.inputs
            g.output(ops.silu(x) * 2.0 + 1.0)
        return g

    x = rng.standard_normal((4, 8)).astype(np.float32)
    want = InferenceSession(optimization_level=1).load(build()).execute(x)[0].to_numpy()
    torch._dynamo.reset()
    got = InferenceSession(optimization_level=2).load(build()).execute(x)[0].to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)

    calls = []

    def failing_compile(module, **kw):
        def run(*a):
            calls.append(1)
            raise dexc.InternalTorchDynamoError("cannot trace this kernel")
        return run

    monkeypatch.setattr(torch, "compile", failing_compile)
    m = InferenceSession(optimization_level=2).load(build())
    with pytest.warns(RuntimeWarning, match="could not compile graph 'l2'.*running it uncompiled"):
        first = m.execute(x)[0].to_numpy()
    second = m.execute(x)[0].to_numpy()  # no second attempt, no second warning
    assert len(calls) == 1
    np.testing.assert_allclose(first, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(second, want, rtol=1e-6, atol=1e-6)
