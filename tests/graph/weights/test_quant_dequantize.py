"""QuantizationEncoding metadata and bit-exact GGML dequantisation against gguf.quants."""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from max.engine.kernels.quantization import dequantize, dequantize_blocks, prepare_qweight, qmatmul  # noqa: E402
from max.graph.quantization import BlockParameters, QuantizationConfig, QuantizationEncoding  # noqa: E402

T = gguf.GGMLQuantizationType
FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "gguf", "real_blocks.gguf")
GGML_KINDS = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
QUANTIZABLE = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]  # gguf-py can make these


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Identical float32 bit patterns; NaNs must sit at the same places (payloads may differ
    where two NaN operands meet: which one propagates depends on operand order)."""
    if not (a.shape == b.shape and a.dtype == b.dtype == np.float32):
        return False
    na, nb = np.isnan(a), np.isnan(b)
    return bool(np.array_equal(na, nb) and np.array_equal(a[~na].view(np.uint32), b[~nb].view(np.uint32)))


# ---------------------------------------------------------------- encodings
def test_encoding_metadata_matches_ggml():
    for name in GGML_KINDS:
        enc = QuantizationEncoding[name]
        assert (enc.elements_per_block, enc.block_size) == gguf.GGML_QUANT_SIZES[T[name]]
        assert enc.block_parameters == BlockParameters(enc.elements_per_block, enc.block_size)
        assert enc.is_gguf
        assert enc.name == name.lower()
    assert not QuantizationEncoding.GPTQ.is_gguf
    assert QuantizationEncoding.GPTQ.name == "gptq"
    assert QuantizationEncoding("Q4_K") is QuantizationEncoding.Q4_K


def test_quantization_config_fields():
    c = QuantizationConfig(quant_method="gptq", bits=4, group_size=128)
    assert (c.desc_act, c.sym) == (False, False)
    assert QuantizationConfig("gptq", 4, 128, True, True).sym


# ---------------------------------------------------------------- bit-exactness
@pytest.mark.parametrize("name", QUANTIZABLE)
def test_dequantize_bit_exact_quantized_by_gguf(name):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((7, 128)) * rng.uniform(0.01, 10, size=(7, 1))).astype(np.float32)
    x[3] = 0.0  # an all-zero row (d == 0)
    blocks = gguf.quants.quantize(x, T[name])
    ref = gguf.quants.dequantize(blocks, T[name])
    got = dequantize(torch.from_numpy(blocks), QuantizationEncoding[name]).numpy()
    assert _same_bits(ref, got)


@pytest.mark.parametrize("name", GGML_KINDS)
def test_dequantize_bit_exact_random_bytes(name):
    # Any bytes are a valid block; NaN/inf scales included, compared bit for bit.
    epb, bs = gguf.GGML_QUANT_SIZES[T[name]]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    blocks = rng.integers(0, 256, size=(5, 3 * bs), dtype=np.uint8)
    with np.errstate(all="ignore"):
        ref = gguf.quants.dequantize(blocks, T[name])
    got = dequantize(blocks, name).numpy()  # numpy input and a str encoding are accepted
    assert _same_bits(ref, got)
    # block-level entry point
    flat = dequantize_blocks(torch.from_numpy(blocks.reshape(-1, bs)), QuantizationEncoding[name]).numpy()
    assert _same_bits(ref.reshape(-1, epb), flat)


@pytest.mark.parametrize("kind,np_dt", [("F32", np.float32), ("F16", np.float16), ("BF16", None)])
def test_dequantize_float_kinds_bit_exact(kind, np_dt):
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, size=(3, 64), dtype=np.uint8)
    with np.errstate(all="ignore"):
        ref = gguf.quants.dequantize(raw if np_dt is None else raw.view(np_dt), T[kind])
    got = dequantize(raw, kind).numpy()
    assert _same_bits(np.ascontiguousarray(ref, dtype=np.float32), got)


def test_dequantize_real_blocks_fixture_bit_exact():
    r = gguf.GGUFReader(FIXTURE)
    kinds = set()
    for t in r.tensors:
        ref = gguf.quants.dequantize(t.data, t.tensor_type)
        got = dequantize(np.asarray(t.data), t.tensor_type).numpy()
        assert _same_bits(np.asarray(ref, dtype=np.float32), got), t.name
        kinds.add(t.tensor_type.name)
    assert {"Q4_1", "Q8_0", "Q4_K", "Q6_K", "Q5_0", "Q2_K", "Q3_K", "Q5_K", "F32"} <= kinds


def test_dequantize_chunked_large_matches(monkeypatch):
    import max.graph.quantization.codec as kq

    monkeypatch.setattr(kq, "_CHUNK_BLOCKS", 3)
    rng = np.random.default_rng(2)
    blocks = gguf.quants.quantize(rng.standard_normal((4, 320)).astype(np.float32), T.Q8_0)
    assert _same_bits(gguf.quants.dequantize(blocks, T.Q8_0), kq.dequantize(blocks, "Q8_0").numpy())


def test_dequantize_errors():
    with pytest.raises(ValueError, match="multiple of 18 bytes"):
        dequantize(np.zeros((2, 20), np.uint8), QuantizationEncoding.Q4_0)
    with pytest.raises(ValueError, match="unknown encoding"):
        dequantize(np.zeros((2, 18), np.uint8), "Q9_9")
    with pytest.raises(ValueError, match="GPTQ"):
        dequantize(np.zeros((2, 16), np.uint8), QuantizationEncoding.GPTQ)


# ---------------------------------------------------------------- qmatmul
@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q8_0", "Q6_K", "Q2_K"])
def test_qmatmul_matches_dequantized_matmul(name):
    rng = np.random.default_rng(3)
    n, k = 48, 512
    if name in QUANTIZABLE:
        blocks = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), T[name])
    else:
        epb, bs = gguf.GGML_QUANT_SIZES[T[name]]
        blocks = rng.integers(0, 256, size=(n, k // epb, bs), dtype=np.uint8)
        offs = {"Q4_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82)}[name]
        for o in offs:
            blocks[:, :, o:o + 2] = np.float16(rng.uniform(0.001, 0.02, size=(n, k // epb))).view(np.uint8).reshape(n, -1, 2)
        blocks = blocks.reshape(n, -1)
    bt = torch.from_numpy(blocks)
    w = dequantize(bt, name).double()
    x = torch.randn(2, 3, k, generator=torch.Generator().manual_seed(0))
    ref = x.double() @ w.T
    scale = x.double().abs() @ w.abs().T  # bound on the float32 rounding error's scale
    exact = qmatmul(x, bt, name, tile_rows=20, fast=False)
    assert exact.shape == (2, 3, n) and exact.dtype == torch.float32
    assert bool(((exact.double() - ref).abs() <= 1e-5 * scale + 1e-6).all())
    p = prepare_qweight(bt, name)
    int4 = name in ("Q4_0", "Q4_1", "Q4_K")
    assert p.kind == ("int4pack" if int4 else "tiles")
    # the fast int4 kernel rounds activations and scales to bfloat16
    tol = 2e-2 if int4 else 1e-5
    got = qmatmul(x, p)
    assert got.dtype == torch.float32
    assert bool(((got.double() - ref).abs() <= tol * scale + 1e-6).all())


def test_qmatmul_shape_error():
    blocks = np.zeros((16, 18), np.uint8)
    with pytest.raises(ValueError, match="x has 64 features"):
        qmatmul(torch.zeros(1, 64), torch.from_numpy(blocks), "Q4_0")
