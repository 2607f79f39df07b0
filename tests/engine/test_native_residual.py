"""The native lowering's residual epilogue: ``r + P(x)`` for a projection ``P`` over packed GGML weights is one
``fused_matmul_t`` that adds ``r`` in the native kernel; results are bit for bit those of the separate add, and
close to a float64 reference.  It only fires where it may."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import quants  # noqa: E402

from max.dtype import DType  # noqa: E402
from max.engine import InferenceSession, native  # noqa: E402
from max.engine.compiler import native_lowering  # noqa: E402
from max.graph import DeviceRef, Graph, TensorType, Weight, ops  # noqa: E402
from max.graph.quantization import QuantizationEncoding as Q  # noqa: E402
from support import q8_activation_reference  # noqa: E402

if native.lib() is None:  # pragma: no cover - no C compiler on this machine
    pytest.skip(f"native kernels unavailable: {native.error()}", allow_module_level=True)

CPU = DeviceRef.CPU()
K, N = 64, 40


def _graph(m: int, shape: str, qb: np.ndarray) -> Graph:
    with Graph(f"res_{shape}", input_types=[TensorType(DType.float32, (m, K), CPU),
                                            TensorType(DType.float32, (m, N), CPU)]) as g:
        x, r = g.inputs
        w = Weight("w", DType.uint8, qb.shape, CPU)
        p = ops.qmatmul(Q.Q4_1, None, x, w)
        if shape == "r+p":
            g.output(r + p)
        elif shape == "p+r":
            g.output(p + r)
        elif shape == "gated":  # the projection's result gated first: no epilogue
            g.output(r + ops.silu(p))
        else:  # "shared": the projection is also an output, so it stays its own value
            g.output(r + p, p)
    return g


def _run(m, shape, qb, x, r, fuse=True, monkeypatch=None):
    if not fuse:
        monkeypatch.setattr(native_lowering, "_fuse_residual", lambda prog: 0)
    s = InferenceSession()
    outs = s.load(_graph(m, shape, qb), weights_registry={"w": qb}).execute(x, r)
    if not fuse:
        monkeypatch.undo()
    return [o.to_numpy() for o in outs], s.last_compile_stats.get("native", {})


@pytest.mark.parametrize("shape", ["r+p", "p+r"])
@pytest.mark.parametrize("m", [1, 5])
def test_residual_add_runs_in_the_projection_epilogue(shape, m, monkeypatch):
    rng = np.random.default_rng(m)
    qb = quants.quantize(rng.standard_normal((N, K)).astype(np.float32), T.Q4_1)
    x = (rng.standard_normal((m, K)) * 2).astype(np.float32)
    r = (rng.standard_normal((m, N)) * 3).astype(np.float32)
    (got,), stats = _run(m, shape, qb, x, r)
    assert stats.get("residual_epilogue") == 1, stats
    (want,), stats0 = _run(m, shape, qb, x, r, fuse=False, monkeypatch=monkeypatch)
    assert not stats0.get("residual_epilogue")
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    ref = q8_activation_reference(x, quants.dequantize(qb, T.Q4_1).astype(np.float64)) + r
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())


@pytest.mark.parametrize("shape", ["gated", "shared"])
def test_no_residual_epilogue_where_the_projection_is_read_otherwise(shape):
    rng = np.random.default_rng(3)
    qb = quants.quantize(rng.standard_normal((N, K)).astype(np.float32), T.Q4_1)
    x = rng.standard_normal((2, K)).astype(np.float32)
    r = rng.standard_normal((2, N)).astype(np.float32)
    outs, stats = _run(2, shape, qb, x, r)
    assert not stats.get("residual_epilogue"), stats
    p = q8_activation_reference(x, quants.dequantize(qb, T.Q4_1).astype(np.float64))
    want = r + (p / (1 + np.exp(-p)) if shape == "gated" else p)
    np.testing.assert_allclose(outs[0], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("native_max_m", [0, 1 << 40])
def test_unprepared_kernel_adds_the_residual_as_the_separate_add(native_max_m):
    """fused_matmul_t(.., residual=True) itself (the path taken without load-time preparation): the native
    kernel's epilogue, or torch (native_max_m = 0) then the add -- each bit for bit ``r + P(x)``."""
    import torch

    from max.engine.kernels.fused import fused_matmul_t

    rng = np.random.default_rng(9)
    qb = quants.quantize(rng.standard_normal((N, K)).astype(np.float32), T.Q4_1)
    packed = native.pack(torch.from_numpy(qb), native.GGML_KINDS["Q4_1"], N, K)
    x = torch.from_numpy(rng.standard_normal((2, 3, K)).astype(np.float32))
    r = torch.from_numpy(rng.standard_normal((2, 3, N)).astype(np.float32))
    attrs = dict(kinds=("packed:Q4_1",), ns=(N,), k=K, has_bias=(False,), act=None, native_max_m=native_max_m,
                 native=native.isa())
    got = fused_matmul_t(x, packed, r, residual=True, **attrs)
    want = torch.add(r, fused_matmul_t(x, packed, **attrs))
    assert got.shape == (2, 3, N)
    np.testing.assert_array_equal(got.numpy().view(np.uint32), want.numpy().view(np.uint32))


@pytest.mark.parametrize("act", [None, "silu", "gelu_tanh", "gelu"])
@pytest.mark.parametrize("norm", [False, True])
def test_prepared_packed_call_equals_the_kernel(act, norm):
    """The prepared projection over packed weights (one lmx_packed_call with the plan bound: plain, with the
    gate of [gate | up], or with the residual) is bit for bit the unprepared fused_matmul_t (MatmulPlan,
    then lmx_glu / the torch gate, then the add)."""
    import torch

    from max.engine.kernels.fused import fused_matmul_t, prepare_fused_matmul_t

    rng = np.random.default_rng(4)
    code = native.GGML_KINDS["Q4_1"]
    ws = [native.pack(torch.from_numpy(quants.quantize(rng.standard_normal((N, K)).astype(np.float32), T.Q4_1)),
                      code, N, K) for _ in range(2)]
    gamma = torch.from_numpy(rng.uniform(0.5, 1.5, K).astype(np.float32))
    attrs = dict(kinds=("packed:Q4_1",) * 2, ns=(N, N), k=K, has_bias=(False, False), act=act,
                 norm_eps=1e-5 if norm else None, native_max_m=1 << 40, native=native.isa())
    ops_ = [*ws, gamma] if norm else ws
    x = torch.from_numpy(rng.standard_normal((3, K)).astype(np.float32))
    run = prepare_fused_matmul_t([None, *ops_], **attrs)
    want = fused_matmul_t(x, *ops_, **attrs)
    np.testing.assert_array_equal(run(x).numpy().view(np.uint32), want.numpy().view(np.uint32))
    if act is None:
        r = torch.from_numpy(rng.standard_normal((3, 2 * N)).astype(np.float32))
        run_res = prepare_fused_matmul_t([None, *ops_, None], **attrs, residual=True)
        got = run_res(x, r)
        np.testing.assert_array_equal(got.numpy().view(np.uint32), torch.add(r, want).numpy().view(np.uint32))
