"""max.graph.quantization: the one format table, and the codec's reference quantiser
against the gguf package (ggml's reference), on random weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")

from max.graph.quantization import QuantizationEncoding, codec, formats  # noqa: E402

ON_LOAD = [f.name for f in formats.quantizable_on_load()]


def test_table_agrees_with_ggml():
    """Ids, block sizes and names of every GGML row are ggml's (as the gguf package lists them)."""
    for f in formats.FORMATS:
        if f.ggml_id is None:
            continue
        t = gguf.GGMLQuantizationType(f.ggml_id)
        assert t.name == f.name
        if f.loadable:
            assert gguf.GGML_QUANT_SIZES[t] == (f.elements_per_block, f.block_size), f.name
    assert formats.GGML_TYPE_NAMES[12] == "Q4_K"
    assert [e._name_ for e in QuantizationEncoding] == [f.name for f in formats.encoding_formats()]
    assert QuantizationEncoding.Q6_K.block_size == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q6_K][1]


def test_encoding_lists_are_derived():
    from max.pipelines.architectures.common.arch import DECODER_ENCODINGS
    from max.pipelines.lib.hf_utils import SupportedEncoding

    assert [e.value for e in SupportedEncoding] == formats.encoding_names()
    assert DECODER_ENCODINGS == formats.encoding_names(ggml_only=True) + ["gptq"]  # GPTQ/AWQ safetensors
    assert {"q4_0", "q8_0"} <= {f.user_name for f in formats.quantizable_on_load()}
    assert "q4_k" in formats.encoding_help()
    with pytest.raises(KeyError, match="unknown weight format 'q9_9'"):
        formats.by_name("q9_9")


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(ON_LOAD), rows=st.integers(1, 5), blocks=st.integers(1, 4),
       scale=st.floats(1e-3, 1e3), seed=st.integers(0, 2**31 - 1), zero_row=st.booleans())
def test_reference_quantiser_is_ggml_bit_for_bit(kind, rows, blocks, scale, seed, zero_row):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, 32 * blocks)) * scale).astype(np.float32)
    if zero_row:
        x[0] = 0.0
    ref = gguf.quants.quantize(x, gguf.GGMLQuantizationType[kind])
    got = codec.quantize_reference(torch.from_numpy(x), kind).numpy()
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(codec.quantize(x, kind.lower()).numpy(), ref)  # native when registered
    back = codec.dequantize(torch.from_numpy(got), kind).numpy()
    np.testing.assert_array_equal(back, gguf.quants.dequantize(ref, gguf.GGMLQuantizationType[kind]))


def test_quantize_errors_name_the_problem():
    with pytest.raises(ValueError, match="cannot be quantised to q4_k .*supported: q4_0"):
        codec.quantize(torch.zeros(2, 256), "Q4_K")
    with pytest.raises(ValueError, match="multiple of 32"):
        codec.quantize(torch.zeros(2, 33), "q8_0")


def test_registered_fast_quantizer_is_used_and_may_decline(monkeypatch):
    calls = []

    def declines(x, kind):
        calls.append(("declined", kind))
        return None  # the next registered one, or the reference, runs

    def accepts(x, kind):
        calls.append(("accepted", kind))
        return codec.quantize_reference(x, kind)

    monkeypatch.setattr(codec, "_FAST_QUANT", [])
    codec.register_quantizer(declines)
    codec.register_quantizer(accepts)
    codec.register_quantizer(accepts)  # registering twice keeps one
    x = torch.randn(3, 64)
    assert torch.equal(codec.quantize(x, "Q5_1"), codec.quantize_reference(x, "Q5_1"))
    assert calls == [("declined", "Q5_1"), ("accepted", "Q5_1")]
