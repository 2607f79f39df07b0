"""The CPU cost model (max.engine.native.cost) and the torch fallback it switches to at large M: blocks
of rows of a packed or half-precision weight widened to float32 in a reused buffer, one GEMM each --
checked against float64 references, and the fused projection taking that path when the model says so."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from max.engine import native  # noqa: E402
from max.engine.kernels import fused  # noqa: E402
from max.engine.native import cost  # noqa: E402

if native.lib() is None:  # pragma: no cover - no C compiler here
    pytest.skip(f"native kernels unavailable: {native.error()}", allow_module_level=True)

from test_native_kernels import blocks, deq  # noqa: E402


def test_cost_model_rules():
    for isa in ("avx512", "avxvnni", "avx2", "neondot", "neon"):
        assert cost.torch_from(isa, "quant") is None  # integer kernels win at every M
        assert cost.native_max_m(isa, ["quant"]) == 1 << 62
        assert cost.native_max_m(isa, ["f32"]) == cost.torch_from(isa, "f32") > 1
        assert cost.native_max_m(isa, ["quant", "f32", "half"]) == cost.torch_from(isa, "f32")
    assert cost.native_max_m("generic", ["f32"]) == 1  # torch's vectorised kernels beat portable C
    assert 1 < cost.native_max_m("generic", ["quant"]) <= 16
    assert cost.native_max_m("torch", ["quant"]) == 1
    from max.dtype import DType
    from max.engine.backend import BackendPolicy, MatmulChoice

    pol = BackendPolicy(native=True, isa="avx2")
    f32_limit = cost.torch_from("avx2", "f32")
    assert pol.matmul_choice(("dense",), [DType.float32], DType.float32, True).native_max_m == f32_limit
    assert pol.matmul_choice(("dense", "Q4_K"), [DType.bfloat16, DType.uint8], DType.float32, True).native_max_m \
        == cost.torch_from("avx2", "half")
    assert pol.matmul_choice(("Q4_K",), [DType.uint8], DType.float32, False).native_max_m == 0  # not on the CPU
    assert pol.matmul_choice(("Q4_K",), [DType.uint8], DType.bfloat16, True).native_max_m == 0  # bf16 activations
    assert BackendPolicy(native=False, isa=None).matmul_choice(("Q4_K",), [DType.uint8], DType.float32,
                                                               True).native_max_m == 0
    exact = BackendPolicy(native=True, isa="avx2", exact_qmatmul=True)
    assert exact.matmul_choice(("Q4_K",), [DType.uint8], DType.float32, True) == MatmulChoice(0, exact=True)
    assert not exact.matmul_choice(("dense",), [DType.float32], DType.float32, True).exact


@pytest.mark.parametrize("kind", ["Q4_K", "Q8_0", "Q6_K", "Q5_1"])
@pytest.mark.parametrize("n", [300, 1000])
def test_blockwise_linear_of_packed_weights_matches_float64(kind, n):
    k = 512
    b = blocks(kind, n, k, n)
    w = deq(kind, b, n, k)
    packed = native.pack(torch.from_numpy(b), native.GGML_KINDS[kind], n, k)
    x = torch.randn(37, k, generator=torch.Generator().manual_seed(1))
    y = fused._blockwise_linear(x, packed, "packed:" + kind, n, k)
    ref = x.double().numpy() @ w.astype(np.float64).T
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_blockwise_linear_of_half_weights_matches_float64(dtype):
    g = torch.Generator().manual_seed(2)
    n, k = 777, 300
    w = torch.randn(n, k, generator=g).to(dtype)
    x = torch.randn(70, k, generator=g)
    y = fused._blockwise_linear(x, w, "dense", n, k)
    ref = x.double() @ w.double().T
    assert float((y.double() - ref).abs().max()) <= 1e-5 * float(ref.abs().max())


@pytest.mark.parametrize("isa", ["avx2", "generic"])
def test_fused_projection_follows_the_cost_model(isa, monkeypatch):
    """Under the portable variant a 40-row quantised projection runs torch over the dequantised blocks
    (float32 activations, so it matches float64 closely); under a SIMD variant the native kernel with
    8-bit activation codes (close to the q8 reference).  Both with a bias and the SiLU gate."""
    if isa not in native.runnable():
        pytest.skip(f"this CPU cannot execute the {isa} kernels")
    from support import q8_activation_reference

    from max.dtype import DType
    from max.engine.backend import BackendPolicy

    choice = BackendPolicy(native=True, isa=isa).matmul_choice(("packed:Q4_K",), [DType.uint8], DType.float32, True)
    assert choice.native_max_m == cost.native_max_m(isa, ["quant"])
    assert (choice.native_max_m > 40) == (isa != "generic")  # 40 rows: native (SIMD) or torch (portable)

    k, n = 256, 64
    b = blocks("Q4_K", n, k, 3)
    w = deq("Q4_K", b, n, k)
    packed = native.pack(torch.from_numpy(b), native.GGML_KINDS["Q4_K"], n, k)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(4))
    x = torch.randn(40, k, generator=torch.Generator().manual_seed(5))
    y = fused.fused_matmul_t(x, packed, bias, kinds=("packed:Q4_K",), ns=(n,), k=k, has_bias=(True,), act="silu",
                              native_max_m=choice.native_max_m, native=isa)
    exact = isa == "generic"
    lin = (x.double().numpy() @ w.astype(np.float64).T) if exact else q8_activation_reference(x.numpy(), w)
    lin = lin + bias.double().numpy()
    ref = (lin[:, : n // 2] / (1 + np.exp(-lin[:, : n // 2]))) * lin[:, n // 2:]
    tol = 1e-5 if exact else 2e-4
    np.testing.assert_allclose(y.numpy(), ref, rtol=tol, atol=tol * np.abs(ref).max())
    if not exact:  # the q8 path differs from exact float activations by more than the tight tolerance
        flin = x.double().numpy() @ w.astype(np.float64).T + bias.double().numpy()
        assert np.abs(lin - flin).max() > 1e-5 * np.abs(flin).max()
