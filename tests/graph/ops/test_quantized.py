"""dequantize / qmatmul against the gguf package's reference dequantizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import quants  # noqa: E402

from max.dtype import DType  # noqa: E402
from max.graph import Graph, TensorType, ops  # noqa: E402
from max.graph.quantization import QuantizationEncoding as Q  # noqa: E402
from support import native_kernels, q8_activation_reference, run_graph  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "gguf" / "real_blocks.gguf"
MAKEABLE = {Q.Q4_0: T.Q4_0, Q.Q4_1: T.Q4_1, Q.Q5_0: T.Q5_0, Q.Q5_1: T.Q5_1, Q.Q8_0: T.Q8_0}


@pytest.mark.parametrize("enc", sorted(MAKEABLE, key=lambda e: e.name))
def test_dequantize_bit_exact_on_quantized_data(enc):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 128)).astype(np.float32)
    qb = quants.quantize(w, MAKEABLE[enc])
    (out,) = run_graph(lambda b: ops.dequantize(enc, b), [TensorType(DType.uint8, qb.shape)], qb)
    ref = quants.dequantize(qb, MAKEABLE[enc])
    assert out.dtype == np.float32 and out.shape == ref.shape
    assert np.array_equal(out.view(np.uint32), ref.astype(np.float32).view(np.uint32))


def test_dequantize_bit_exact_on_real_k_quant_blocks():
    if not FIXTURE.exists():
        pytest.skip("fixture tests/fixtures/gguf/real_blocks.gguf missing")
    r = gguf.GGUFReader(str(FIXTURE))
    seen = set()
    for t in r.tensors:
        name = t.tensor_type.name
        if name not in ("Q4_K", "Q6_K", "Q5_K", "Q2_K", "Q3_K") or name in seen:
            continue
        seen.add(name)
        raw = np.asarray(t.data)
        raw = raw.reshape(raw.shape[0] if raw.ndim > 1 else 1, -1)
        enc = getattr(Q, name)
        (out,) = run_graph(lambda b: ops.dequantize(enc, b), [TensorType(DType.uint8, raw.shape)], raw)
        ref = quants.dequantize(raw, t.tensor_type).astype(np.float32)
        np.testing.assert_array_equal(out.reshape(ref.shape), ref)
    assert {"Q4_K", "Q6_K"} <= seen


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("enc", [Q.Q4_0, Q.Q8_0, Q.Q5_1])
def test_qmatmul_matches_dequantize_then_matmul(enc, exact, monkeypatch):
    """Native kernels: exactly x (8-bit codes per 32 values) @ dequantize(w).T; LIBREMAX_QMATMUL=exact:
    float32 x @ dequantize(w).T."""
    if exact:
        monkeypatch.setenv("LIBREMAX_QMATMUL", "exact")
    rng = np.random.default_rng(2)
    w = rng.standard_normal((24, 64)).astype(np.float32)
    qb = quants.quantize(w, MAKEABLE[enc])
    x = rng.standard_normal((2, 5, 64)).astype(np.float32)
    (out,) = run_graph(lambda a, b: ops.qmatmul(enc, None, a, b),
                       [TensorType(DType.float32, x.shape), TensorType(DType.uint8, qb.shape)], x, qb)
    wf = quants.dequantize(qb, MAKEABLE[enc]).astype(np.float64)
    # GGML blocks in their file layout run the unpacked kernels, which use the 8-bit codes alone (no refinement)
    ref = q8_activation_reference(x, wf, refine=0) if native_kernels() else x.astype(np.float64) @ wf.T
    assert out.shape == (2, 5, 24)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    # and within the 8-bit activation error of the float product either way
    np.testing.assert_allclose(out, x.astype(np.float64) @ wf.T, rtol=0, atol=0.05 * np.abs(ref).max())


def test_quantized_errors_at_build_time():
    with Graph("e", input_types=[TensorType(DType.uint8, (4, 35)), TensorType(DType.float32, (4, 36)),
                                 TensorType(DType.float32, (2, 32)), TensorType(DType.uint8, (4, 36))]) as g:
        bad_bytes, not_u8, x, ok = g.inputs
        with pytest.raises(ValueError, match="dequantize: quantized rows have 35 bytes, not a whole number of q4_0 blocks"):
            ops.dequantize(Q.Q4_0, bad_bytes)
        with pytest.raises(TypeError, match="dequantize: quantized must hold the raw q4_0 blocks as uint8"):
            ops.dequantize(Q.Q4_0, not_u8)
        with pytest.raises(ValueError, match="qmatmul: lhs \\[Dim\\(2\\), Dim\\(32\\)\\] and the q4_0 rhs .*inner dimensions 32 and 128"):
            ops.qmatmul(Q.Q4_0, None, x, ops.concat([ok, ok], axis=1))
        with pytest.raises(ValueError, match="GPTQ weights are decoded with their quantization_config"):
            ops.dequantize(Q.GPTQ, ok)
