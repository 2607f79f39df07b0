"""GGUFWeights: tiny files written with gguf.GGUFWriter, quantized blocks, shapes, bad files."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from max.dtype import DType  # noqa: E402
from max.graph.quantization.codec import dequantize  # noqa: E402
from max.graph.quantization import QuantizationEncoding  # noqa: E402
from max.graph.weights import GGUFWeights, load_weights  # noqa: E402

T = gguf.GGMLQuantizationType
FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "gguf", "real_blocks.gguf")


def _arrays():
    rng = np.random.default_rng(0)
    return {
        "blk.0.attn_q.weight": (rng.standard_normal((8, 64)).astype(np.float32), T.Q4_0),
        "blk.0.attn_k.weight": (rng.standard_normal((4, 64)).astype(np.float32), T.Q8_0),
        "blk.0.ffn_up.weight": (rng.standard_normal((6, 32)).astype(np.float32), T.Q5_1),
        "blk.0.attn_norm.weight": (rng.standard_normal(64).astype(np.float32), T.F32),
        "token_embd.weight": (rng.standard_normal((16, 8)).astype(np.float32), T.F16),
        "output.weight": (rng.standard_normal((3, 5, 8)).astype(np.float32), T.BF16),
        "pos.ids": (np.arange(5, dtype=np.int32), T.I32),
    }


def write_gguf(path, arrays=None):
    w = gguf.GGUFWriter(str(path), "llama")
    for name, (a, qt) in (arrays or _arrays()).items():
        if qt == T.F32:
            w.add_tensor(name, a)
        elif qt == T.F16:
            w.add_tensor(name, a.astype(np.float16))
        elif qt == T.I32:
            w.add_tensor(name, a)
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def gguf_file(tmp_path):
    return write_gguf(tmp_path / "tiny.gguf")


def test_shapes_dtypes_and_encodings(gguf_file):
    w = GGUFWeights(gguf_file)
    q = w.blk[0].attn_q.weight
    assert q.name == "blk.0.attn_q.weight" and q.exists()
    d = q.data()
    assert d.dtype == DType.uint8 and d.quantization_encoding is QuantizationEncoding.Q4_0
    assert d.shape == [8, 64 // 32 * 18]  # raw blocks: (rows, bytes_per_row)
    assert w.blk[0].attn_k.weight.data().quantization_encoding is QuantizationEncoding.Q8_0
    e = w.token_embd.weight.data()
    assert e.dtype == DType.float16 and e.shape == [16, 8]  # row-major: GGUF dims reversed
    assert list(w.token_embd.weight.raw_tensor().shape) == [8, 16]  # gguf-py keeps ne order
    o = w.output.weight.data()
    assert o.dtype == DType.bfloat16 and o.shape == [3, 5, 8]
    assert w.pos.ids.data().dtype == DType.int32
    assert sorted(n for n, _ in w.blk[0].items()) == ["attn_k.weight", "attn_norm.weight", "attn_q.weight", "ffn_up.weight"]


def test_values_match_gguf_reference(gguf_file):
    arrays = _arrays()
    w = GGUFWeights(gguf_file)
    r = gguf.GGUFReader(str(gguf_file))
    for t in r.tensors:
        if t.tensor_type == T.I32:
            assert np.array_equal(w.pos.ids.data().to_numpy(), t.data)
            continue
        ref = gguf.quants.dequantize(t.data, t.tensor_type)
        d = w[t.name].data() if "." not in t.name else _walk(w, t.name).data()
        if d.quantization_encoding is not None:
            got = dequantize(d._torch(), d.quantization_encoding).numpy()
        else:
            got = d._torch().float().numpy()
        assert np.array_equal(np.asarray(ref, np.float32).reshape(got.shape), got), t.name
    # float types are exact, BF16 is the rounded value
    np.testing.assert_array_equal(w.blk[0].attn_norm.weight.data().to_numpy(), arrays["blk.0.attn_norm.weight"][0])
    bf = w.output.weight.data().astype(DType.float32).to_numpy()
    np.testing.assert_allclose(bf, arrays["output.weight"][0], rtol=1e-2)


def _walk(w, name):
    for part in name.split("."):
        w = w[int(part)] if part.isdigit() else getattr(w, part)
    return w


def test_quantized_astype_dequantizes(gguf_file):
    w = GGUFWeights(gguf_file)
    d = w.blk[0].attn_q.weight.data()
    f = d.astype(DType.float32)
    assert f.quantization_encoding is None and f.shape == [8, 64]
    with pytest.raises(ValueError, match="quantized as Q4_0"):
        d.astype(DType.int32)


def test_allocate_quantized_validation(gguf_file):
    w = GGUFWeights(gguf_file)
    wt = w.blk[0].attn_q.weight.allocate(quantization_encoding=QuantizationEncoding.Q4_0)
    assert wt.dtype == DType.uint8 and wt.shape == [8, 36] and wt.quantization_encoding is QuantizationEncoding.Q4_0
    wt2 = w.blk[0].attn_k.weight.allocate(DType.uint8, [4, 68])
    assert wt2.quantization_encoding is QuantizationEncoding.Q8_0
    with pytest.raises(ValueError, match=r"tiny\.gguf.*'blk\.0\.attn_q\.weight'.*Q4_0.*Q4_K"):
        w.blk[0].attn_q.weight.allocate(quantization_encoding=QuantizationEncoding.Q4_K)
    with pytest.raises(ValueError, match=r"quantized as Q4_0.*float32"):
        w.blk[0].attn_q.weight.allocate(DType.float32)
    with pytest.raises(ValueError, match=r"shape \[8, 36\].*\[8, 64\].*stored as uint8"):
        w.blk[0].attn_q.weight.allocate(shape=[8, 64])
    assert sorted(w.allocated_weights) == ["blk.0.attn_k.weight", "blk.0.attn_q.weight"]


def test_real_block_fixture_loads(tmp_path):
    w = GGUFWeights(FIXTURE)
    encs = {d.quantization_encoding for _, acc in w.items() for d in [acc.data()]}
    assert {QuantizationEncoding.Q4_1, QuantizationEncoding.Q8_0, QuantizationEncoding.Q4_K,
            QuantizationEncoding.Q6_K, QuantizationEncoding.Q5_0} <= encs
    q6 = w.gemma3.blk[0].ffn_down.weight.data()
    assert q6.quantization_encoding is QuantizationEncoding.Q6_K and q6.shape[1] == 1680


def test_load_weights_gguf_and_reader_source(gguf_file):
    w = load_weights([gguf_file])
    assert isinstance(w, GGUFWeights)
    w2 = GGUFWeights(gguf.GGUFReader(str(gguf_file)))
    assert torch.equal(w2.token_embd.weight.data()._torch(), w.token_embd.weight.data()._torch())
    with pytest.raises(ValueError, match="single file"):
        load_weights([gguf_file, gguf_file])


def test_bad_magic_version_truncation(gguf_file, tmp_path):
    raw = gguf_file.read_bytes()
    bad = tmp_path / "magic.gguf"
    bad.write_bytes(b"GGUX" + raw[4:])
    with pytest.raises(ValueError, match=r"magic\.gguf.*magic"):
        GGUFWeights(bad)
    ver = tmp_path / "ver.gguf"
    ver.write_bytes(raw[:4] + (9).to_bytes(4, "little") + raw[8:])
    with pytest.raises(ValueError, match=r"ver\.gguf.*version 9"):
        GGUFWeights(ver)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(raw[:-40])
    with pytest.raises(ValueError, match=r"cut\.gguf.*tensor '.*'.*truncated"):
        GGUFWeights(cut)
    hdr = tmp_path / "hdr.gguf"
    hdr.write_bytes(raw[:60])
    with pytest.raises(ValueError, match=r"hdr\.gguf.*truncated"):
        GGUFWeights(hdr)
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        GGUFWeights(tmp_path / "nope.gguf")


def test_tensor_size_disagreeing_with_layout(tmp_path):
    # Patch the first tensor's type in the header from Q4_0 to Q8_0: its bytes no longer fit
    # before the next tensor.
    p = write_gguf(tmp_path / "t.gguf", {
        "a.weight": (np.ones((4, 64), np.float32), T.Q4_0),
        "b.weight": (np.ones((4, 64), np.float32), T.Q4_0),
    })
    raw = bytearray(p.read_bytes())
    name = b"a.weight"
    i = raw.index(name) + len(name)
    # n_dims (u32) + 2 dims (u64) then type (u32)
    ti = i + 4 + 16
    assert int.from_bytes(raw[ti:ti + 4], "little") == int(T.Q4_0)
    raw[ti:ti + 4] = int(T.Q8_0).to_bytes(4, "little")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"bad\.gguf.*'a\.weight'.*Q8_0.*needs 272 bytes.*'b\.weight'"):
        GGUFWeights(bad)
