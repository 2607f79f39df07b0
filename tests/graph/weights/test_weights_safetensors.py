"""SafetensorWeights: single file, sharded index, navigation, allocation, dtype conversion, bad files."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from max.dtype import DType
from max.graph import DeviceRef, Weight
from max.graph.weights import SafetensorWeights, WeightData, load_weights


def _sd():
    g = torch.Generator().manual_seed(0)
    return {
        "model.embed.weight": torch.randn(10, 4, generator=g),
        "model.layers.0.attn.q_proj.weight": torch.randn(4, 4, generator=g).to(torch.bfloat16),
        "model.layers.0.attn.q_proj.bias": torch.randn(4, generator=g).to(torch.float16),
        "model.layers.1.attn.q_proj.weight": torch.randn(4, 4, generator=g),
        "model.step": torch.tensor(7, dtype=torch.int64),
        "lm_head.weight": torch.randn(10, 4, generator=g),
    }


@pytest.fixture
def st_file(tmp_path):
    p = tmp_path / "model.safetensors"
    save_file(_sd(), str(p))
    return p


def test_navigation_names_exists_items(st_file):
    w = SafetensorWeights([st_file])
    q = w.model.layers[0].attn.q_proj.weight
    assert q.name == "model.layers.0.attn.q_proj.weight"
    assert q.exists() and not w.model.layers[0].exists()
    assert w["model"]["layers"][1].attn.q_proj.weight.exists()
    names = [n for n, _ in w.model.layers[0].items()]
    assert sorted(names) == ["attn.q_proj.bias", "attn.q_proj.weight"]
    full = sorted(acc.name for _, acc in w.items())
    assert full == sorted(_sd())
    assert q.dtype == DType.bfloat16 and q.shape == [4, 4] and q.quantization_encoding is None


def test_data_values_and_zero_copy(st_file):
    sd = _sd()
    w = SafetensorWeights([st_file])
    for name, ref in sd.items():
        d = w[name].data() if "." not in name else _walk(w, name).data()
        assert isinstance(d, WeightData)
        assert d.name == name and d.dtype == DType.from_torch(ref.dtype) and d.shape == list(ref.shape)
        assert torch.equal(torch.from_dlpack(d) if d.dtype != DType.bfloat16 else d._torch(), ref)
    # memory-mapped: the tensor's storage is the file map, not a private copy of each tensor
    t1 = w.model.embed.weight.data().data
    t2 = w.lm_head.weight.data().data
    assert t1.untyped_storage().data_ptr() == t2.untyped_storage().data_ptr()


def _walk(w, name):
    for part in name.split("."):
        w = w[int(part)] if part.isdigit() else getattr(w, part)
    return w


def test_missing_name_keyerror_with_suggestions(st_file):
    w = SafetensorWeights([st_file])
    with pytest.raises(KeyError, match=r"model\.layers\.0\.attn\.q_proj\.weight") as e:
        w.model.layers[0].attn.q_prj.weight.data()
    assert "model.safetensors" in str(e.value)
    with pytest.raises(KeyError):
        w.nothing.allocate()


def test_allocate_validates_and_registers(st_file):
    w = SafetensorWeights([st_file])
    wt = w.model.embed.weight.allocate(DType.float32, [10, 4])
    assert isinstance(wt, Weight) and wt.name == "model.embed.weight" and wt.dtype == DType.float32
    assert wt.device == DeviceRef.CPU()
    reg = w.allocated_weights
    assert list(reg) == ["model.embed.weight"] and torch.equal(reg["model.embed.weight"], _sd()["model.embed.weight"])
    with pytest.raises(ValueError, match=r"model\.safetensors.*'lm_head\.weight'.*shape \[10, 4\].*\[4, 10\]"):
        w.lm_head.weight.allocate(shape=[4, 10])
    with pytest.raises(ValueError, match=r"'model\.step'.*int64.*float32"):
        w.model.step.allocate(DType.float32)
    with pytest.raises(ValueError, match="quantize"):
        from max.graph.quantization import QuantizationEncoding

        w.lm_head.weight.allocate(quantization_encoding=QuantizationEncoding.Q4_0)
    assert "lm_head.weight" not in w.allocated_weights  # failed allocations leave nothing behind


def test_allocate_dtype_conversion(st_file):
    w = SafetensorWeights([st_file])
    wt = w.model.layers[0].attn.q_proj.weight.allocate(DType.float32)
    assert wt.dtype == DType.float32
    t = w.allocated_weights["model.layers.0.attn.q_proj.weight"]
    assert t.dtype == torch.float32 and torch.equal(t, _sd()["model.layers.0.attn.q_proj.weight"].float())
    d = w.model.layers[0].attn.q_proj.bias.data().astype(DType.float32)
    assert d.dtype == DType.float32 and torch.equal(d._torch(), _sd()["model.layers.0.attn.q_proj.bias"].float())
    assert d.astype(DType.float32) is d


def test_allocate_as_bytes(st_file):
    w = SafetensorWeights([st_file])
    wt = w.lm_head.weight.allocate_as_bytes()
    assert wt.dtype == DType.uint8 and wt.shape == [10, 16]
    b = w.allocated_weights["lm_head.weight"]
    assert torch.equal(b.view(torch.float32), _sd()["lm_head.weight"])
    s = w.model.step.allocate_as_bytes()
    assert s.shape == [8]
    h = w.model.layers[0].attn.q_proj.weight.allocate_as_bytes(DType.float32)
    assert h.shape == [4, 16]


def test_weightdata_from_numpy_and_dlpack():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    d = WeightData.from_numpy(a, "x")
    assert d.dtype == DType.float32 and d.shape == [2, 3] and d.name == "x"
    assert np.array_equal(torch.from_dlpack(d).numpy(), a)
    assert np.array_equal(d.astype(DType.float16).to_numpy(), a.astype(np.float16))
    import ml_dtypes

    b = WeightData.from_numpy(a.astype(ml_dtypes.bfloat16), "y")
    assert b.dtype == DType.bfloat16 and b._torch().dtype == torch.bfloat16
    assert np.array_equal(b.astype(DType.float32).to_numpy(), a)
    assert b.view(DType.uint8).shape == [2, 6]


def _sharded(tmp_path, drop=None):
    sd = _sd()
    a = {k: v for k, v in sd.items() if k.startswith("model.layers")}
    b = {k: v for k, v in sd.items() if not k.startswith("model.layers")}
    save_file(a, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file(b, str(tmp_path / "model-00002-of-00002.safetensors"))
    wm = {k: "model-00001-of-00002.safetensors" for k in a} | {k: "model-00002-of-00002.safetensors" for k in b}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    if drop:
        os.remove(tmp_path / drop)
    return tmp_path


def test_sharded_index_and_shard_list(tmp_path):
    d = _sharded(tmp_path)
    w1 = load_weights([d / "model.safetensors.index.json"])
    w2 = load_weights(sorted(d.glob("*.safetensors")))
    for w in (w1, w2):
        assert isinstance(w, SafetensorWeights)
        assert sorted(acc.name for _, acc in w.items()) == sorted(_sd())
        assert torch.equal(w.lm_head.weight.data()._torch(), _sd()["lm_head.weight"])
        assert w.model.layers[1].attn.q_proj.weight.data().data.shape == (4, 4)


def test_missing_shard(tmp_path):
    d = _sharded(tmp_path, drop="model-00002-of-00002.safetensors")
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        load_weights([d / "model.safetensors.index.json"])
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002"):
        SafetensorWeights([d / "model-00001-of-00002.safetensors", d / "model-00002-of-00002.safetensors"])


def test_truncated_and_corrupt_files(st_file, tmp_path):
    raw = st_file.read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(raw[:-8])
    with pytest.raises(ValueError, match=r"cut\.safetensors.*tensor '.*'.*truncated"):
        SafetensorWeights([cut])
    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(raw[:5])
    with pytest.raises(ValueError, match=r"tiny\.safetensors.*truncated"):
        SafetensorWeights([tiny])
    hdr = tmp_path / "hdr.safetensors"
    hdr.write_bytes(raw[:40])
    with pytest.raises(ValueError, match=r"hdr\.safetensors.*truncated"):
        SafetensorWeights([hdr])
    # byte range disagreeing with dtype x shape
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header["lm_head.weight"]["shape"] = [10, 5]
    hb = json.dumps(header).encode()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(len(hb).to_bytes(8, "little") + hb + raw[8 + n:])
    with pytest.raises(ValueError, match=r"bad\.safetensors.*'lm_head\.weight'.*needs 200"):
        SafetensorWeights([bad])


def test_duplicate_across_shards(st_file, tmp_path):
    other = tmp_path / "other.safetensors"
    save_file({"lm_head.weight": torch.zeros(2)}, str(other))
    with pytest.raises(ValueError, match="duplicate"):
        SafetensorWeights([st_file, other])
