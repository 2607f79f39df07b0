"""InferenceSession / Model: compile, execute, input checking, weights, passes, cache, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from max import driver
from max.dtype import DType
from max.engine import GPUProfilingMode, InferenceSession, LogLevel, TensorSpec
from max.engine.compiler import lower as lower_mod
from max.graph import DeviceRef, Graph, TensorType, Weight, ops


def _mlp_graph(name="mlp"):
    with Graph(name, input_types=[TensorType(DType.float32, ("batch", 4)), TensorType(DType.float32, (4, 3))]) as g:
        x, w = g.inputs
        g.output(ops.relu(x @ w + 1.0))
    return g


def test_execute_returns_list_of_buffers_and_accepts_many_input_kinds():
    m = InferenceSession().load(_mlp_graph())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    ref = np.maximum(x.astype(np.float64) @ w + 1, 0)
    for args in [(x, w), (driver.Buffer.from_numpy(x), driver.Buffer.from_numpy(w)),
                 (torch.from_numpy(x), torch.from_numpy(w))]:
        out = m.execute(*args)
        assert isinstance(out, list) and len(out) == 1 and isinstance(out[0], driver.Buffer)
        np.testing.assert_allclose(out[0].to_numpy(), ref, rtol=1e-5, atol=1e-5)
    out2 = m(x, w)
    np.testing.assert_allclose(out2[0].to_numpy(), ref, rtol=1e-5, atol=1e-5)


def test_python_scalar_inputs():
    with Graph("s", input_types=[TensorType(DType.float32, ()), TensorType(DType.int64, ())]) as g:
        a, b = g.inputs
        g.output(a * 2, b + 1)
    m = InferenceSession().load(g)
    o = m.execute(1.5, 4)
    assert o[0].to_numpy() == 3.0 and o[1].to_numpy() == 5


def test_metadata():
    m = InferenceSession().load(_mlp_graph())
    assert m.input_metadata == [TensorSpec([None, 4], DType.float32, "input0"), TensorSpec([4, 3], DType.float32, "input1")]
    (o,) = m.output_metadata
    assert o.shape == [None, 3] and o.dtype is DType.float32


@pytest.mark.parametrize(
    "args,exc,msg",
    [
        ((np.zeros((2, 4), np.float32),), ValueError, "expected 2 inputs"),
        ((np.zeros((2, 4), np.float64), np.zeros((4, 3), np.float32)), ValueError,
         "input 'input0'.*got dtype DType.float64, expected DType.float32"),
        ((np.zeros((2, 4, 1), np.float32), np.zeros((4, 3), np.float32)), ValueError, "got rank 3"),
        ((np.zeros((2, 5), np.float32), np.zeros((4, 3), np.float32)), ValueError, "dim 1 is 5, expected 4"),
        ((np.zeros((2, 4), np.float32), "nope"), TypeError, "expected a driver.Buffer, numpy array"),
    ],
)
def test_execute_checks_inputs(args, exc, msg):
    m = InferenceSession().load(_mlp_graph())
    with pytest.raises(exc, match=msg):
        m.execute(*args)


def test_one_size_per_symbolic_dim():
    with Graph("sym", input_types=[TensorType(DType.float32, ("n",)), TensorType(DType.float32, ("n",))]) as g:
        g.output(g.inputs[0] + g.inputs[1])
    m = InferenceSession().load(g)
    with pytest.raises(ValueError, match=r"dim 0 \(n\) is 3, but n is 2 in an earlier input"):
        m.execute(np.zeros(2, np.float32), np.zeros(3, np.float32))
    assert m.execute(np.ones(3, np.float32), np.ones(3, np.float32))[0].to_numpy().tolist() == [2, 2, 2]


def test_weights_bind_zero_copy_and_validate():
    w = Weight("w", DType.float32, (4, 3), DeviceRef.CPU())
    with Graph("wg", input_types=[TensorType(DType.float32, (2, 4))]) as g:
        g.output(g.inputs[0] @ w)
    arr = np.arange(12, dtype=np.float32).reshape(4, 3)
    m = InferenceSession().load(g, weights_registry={"w": arr})
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(m.execute(x)[0].to_numpy(), x @ arr)
    arr[0, 0] = 100.0  # bound without a copy on the CPU
    np.testing.assert_allclose(m.execute(x)[0].to_numpy(), x @ arr)
    with pytest.raises(ValueError, match="weight 'w'.*has no value in weights_registry.*closest names: \\['ww'\\]"):
        InferenceSession().load(g, weights_registry={"ww": arr})
    with pytest.raises(ValueError, match=r"weight 'w' has shape \[3, 4\], the graph declares \[4, 3\]"):
        InferenceSession().load(g, weights_registry={"w": arr.T.copy()})
    with pytest.raises(ValueError, match="weight 'w' has dtype DType.float64"):
        InferenceSession().load(g, weights_registry={"w": arr.astype(np.float64)})


def test_passes_fold_cse_dce():
    with Graph("p", input_types=[TensorType(DType.float32, (3,))]) as g:
        x = g.inputs[0]
        c = ops.constant(np.array([1.0, 2.0, 3.0], np.float32), DType.float32, DeviceRef.CPU())
        folded = ops.exp(c) * 2  # constant-folded
        a = ops.sin(x)
        b = ops.sin(x)  # CSE'd with a
        ops.cos(x)  # dead
        g.output(a + b + folded)
    s = InferenceSession()
    m = s.load(g)
    st = s.last_compile_stats
    assert st["folded"] >= 2 and st["cse"] >= 1 and st["dce"] >= 1
    x = np.array([0.1, 0.2, 0.3], np.float32)
    np.testing.assert_allclose(m.execute(x)[0].to_numpy(), 2 * np.sin(x) + np.exp([1.0, 2.0, 3.0]) * 2, rtol=1e-6)
    code = m._lowered.module.code
    assert "torch.cos" not in code and code.count("torch.sin(") == 1


def test_compile_cache_reuses_structurally_equal_graphs():
    lower_mod._CACHE.clear()
    s = InferenceSession()
    m1 = s.load(_mlp_graph("a"))
    hits = lower_mod.cache_stats["hits"]
    m2 = s.load(_mlp_graph("a"))
    assert lower_mod.cache_stats["hits"] == hits + 1
    assert m1._lowered.module is m2._lowered.module


def test_different_constants_are_not_confused_by_the_cache():
    def build(v):
        with Graph("k", input_types=[TensorType(DType.float32, (2,))]) as g:
            g.output(g.inputs[0] + v)
        return g

    s = InferenceSession()
    x = np.zeros(2, np.float32)
    assert s.load(build(1.0)).execute(x)[0].to_numpy().tolist() == [1, 1]
    assert s.load(build(2.0)).execute(x)[0].to_numpy().tolist() == [2, 2]


def test_runtime_error_points_at_the_users_line():
    with Graph("r", input_types=[TensorType(DType.float32, ("n",))]) as g:
        x = g.inputs[0]
        y = ops.exp(x)
        g.output(y)
    # a kernel failing at run time (shape mismatch surfaced by torch) names the op and its line
    from max.engine.kernels import KERNELS, KernelSpec

    old = KERNELS["exp"]
    KERNELS["exp"] = KernelSpec("exp", lambda t: (_ for _ in ()).throw(RuntimeError("boom")))
    try:
        from max.engine.compiler import lower as L

        L._CACHE.clear()
        m = InferenceSession().load(g)
    finally:
        KERNELS["exp"] = old
    with pytest.raises(RuntimeError, match=r"exp \(created at .*test_engine.py:\d+\) failed.*boom"):
        m.execute(np.zeros(4, np.float32))
    L._CACHE.clear()


def test_graph_without_output_never_reaches_the_engine():
    with Graph("noout", input_types=[TensorType(DType.float32, (2,))]) as g:
        ops.exp(g.inputs[0])
    with pytest.raises(ValueError, match="has no outputs"):
        InferenceSession().load(g)


def test_load_rejects_paths_and_non_graphs():
    with pytest.raises(RuntimeError, match="not supported"):
        InferenceSession().load("model.mef")
    with pytest.raises(TypeError, match="expected a Graph"):
        InferenceSession().load(42)


def test_session_settings():
    s = InferenceSession(devices=[driver.CPU()])
    assert s.devices == [driver.CPU()]
    s.gpu_profiling("on")
    s.gpu_profiling(GPUProfilingMode.DETAILED)
    with pytest.raises(ValueError, match="gpu_profiling"):
        s.gpu_profiling("loud")
    s.set_mojo_log_level(LogLevel.DEBUG)
    s.set_mojo_log_level("info")
    with pytest.raises(ValueError):
        s.set_mojo_log_level("chatty")
    s.set_mojo_assert_level("all")
    s.set_split_k_reduction_precision("ACCUM")
    s.use_old_top_k_kernel("false")


def test_gpu_placement_without_gpu_session_fails_at_load():
    with Graph("gpu", input_types=[TensorType(DType.float32, (2,), DeviceRef.GPU())]) as g:
        g.output(g.inputs[0] + 1)
    with pytest.raises(ValueError, match="placed on gpu:0"):
        InferenceSession().load(g)


def test_capture_replay_contract_on_cpu():
    m = InferenceSession().load(_mlp_graph())
    x = np.ones((2, 4), np.float32)
    w = np.ones((4, 3), np.float32)
    with pytest.raises(RuntimeError, match="nothing was captured"):
        m.replay(7, x, w)
    m.capture(7, x, w)
    np.testing.assert_allclose(m.replay(7, x, w)[0].to_numpy(), 5.0)
    m.debug_verify_replay(7, x, w)
    with pytest.raises(TypeError):
        m.capture("k", x, w)
    with pytest.raises(ValueError):
        m.capture(-1, x, w)
    with pytest.raises(ValueError):
        m.capture(1)


@pytest.mark.gpu
def test_capture_replay_uses_cuda_graphs_on_gpu():
    gpu = driver.Accelerator()
    with Graph("g", input_types=[TensorType(DType.float32, (4, 4), DeviceRef.GPU())]) as g:
        x = g.inputs[0]
        g.output(ops.relu(x @ x) + 1)
    m = InferenceSession(devices=[driver.CPU(), gpu]).load(g)
    a = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32)
    buf_a = driver.Buffer.from_numpy(a).to(gpu)
    buf_b = driver.Buffer.from_numpy(b).to(gpu)
    m.capture(3, buf_a)
    assert m._captured[3][1] is not None  # a CUDA graph was recorded
    out = m.replay(3, buf_b)[0].to_numpy()
    np.testing.assert_allclose(out, np.maximum(b @ b, 0) + 1, rtol=1e-4, atol=1e-4)
    m.debug_verify_replay(3, buf_a)
