"""PytorchWeights: weights-only, memory-mapped loading; code-containing files are refused unexecuted."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from max.dtype import DType
from max.graph.weights import PytorchWeights, UnsafeCheckpointError, load_weights


def _sd():
    g = torch.Generator().manual_seed(0)
    return {"encoder.layer.0.w": torch.randn(3, 4, generator=g), "encoder.layer.0.b": torch.zeros(3, dtype=torch.float16),
            "head.w": torch.randn(2, 3, generator=g).to(torch.bfloat16)}


def test_load_navigate_allocate(tmp_path):
    p = tmp_path / "pytorch_model.bin"
    torch.save(_sd(), p)
    w = load_weights([p])
    assert isinstance(w, PytorchWeights)
    assert w.encoder.layer[0].w.exists() and w.encoder.layer[0].w.dtype == DType.float32
    assert w.encoder.layer[0].w.shape == [3, 4]
    assert sorted(n for n, _ in w.encoder.layer[0].items()) == ["b", "w"]
    assert torch.equal(w.head.w.data()._torch(), _sd()["head.w"])
    wt = w.head.w.allocate(DType.float32, [2, 3])
    assert wt.dtype == DType.float32
    assert torch.equal(w.allocated_weights["head.w"], _sd()["head.w"].float())
    with pytest.raises(ValueError, match=r"pytorch_model\.bin.*'encoder\.layer\.0\.w'.*shape \[3, 4\]"):
        w.encoder.layer[0].w.allocate(shape=[4, 3])
    with pytest.raises(KeyError, match="closest names"):
        w.encoder.layer[0].ww.data()


def test_nested_state_dict_and_pt_extension(tmp_path):
    p = tmp_path / "ckpt.pt"
    torch.save({"state_dict": _sd(), "epoch": 3}, p)
    w = PytorchWeights(p)
    assert w.state_dict.head.w.exists() and not w.epoch.exists()


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > " + os.environ.get("EVIL_MARKER", "/dev/null"),))


def test_code_containing_bin_is_refused_not_executed(tmp_path, monkeypatch):
    marker = tmp_path / "pwned.txt"
    monkeypatch.setenv("EVIL_MARKER", str(marker))
    p = tmp_path / "evil.bin"
    torch.save({"w": torch.zeros(2), "x": _Evil()}, p)
    assert not marker.exists()
    with pytest.raises(UnsafeCheckpointError, match=r"evil\.bin.*not executed"):
        load_weights([p])
    assert not marker.exists()
    # a raw (non-zip) pickle too
    q = tmp_path / "evil2.bin"
    with open(q, "wb") as f:
        pickle.dump({"x": _Evil()}, f)
    with pytest.raises(ValueError, match=r"evil2\.bin"):
        PytorchWeights(q)
    assert not marker.exists()


def test_truncated_and_non_dict(tmp_path):
    p = tmp_path / "m.bin"
    torch.save(_sd(), p)
    cut = tmp_path / "cut.bin"
    cut.write_bytes(p.read_bytes()[:200])
    with pytest.raises(ValueError, match=r"cut\.bin.*corrupt or truncated"):
        PytorchWeights(cut)
    t = tmp_path / "t.pt"
    torch.save(torch.zeros(2), t)
    with pytest.raises(ValueError, match=r"t\.pt.*single tensor"):
        PytorchWeights(t)
    with pytest.raises(FileNotFoundError, match="missing.bin"):
        PytorchWeights(tmp_path / "missing.bin")
