"""weights_format / load_weights, and an end-to-end graph run on allocated checkpoint weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, ops
from max.graph.weights import WeightsFormat, load_weights, weights_format


def test_weights_format_detection():
    assert weights_format([Path("a-00001.safetensors"), Path("a-00002.safetensors")]) is WeightsFormat.safetensors
    assert weights_format([Path("m.gguf")]) is WeightsFormat.gguf
    assert weights_format(["pytorch_model.bin", "x.pt", "y.pth"]) is WeightsFormat.pytorch
    assert weights_format([Path("model.safetensors.index.json")]) is WeightsFormat.safetensors
    assert WeightsFormat.gguf.value == "gguf"
    with pytest.raises(ValueError, match="no weight paths"):
        weights_format([])
    with pytest.raises(ValueError, match="mix formats.*safetensors.*gguf"):
        weights_format([Path("a.safetensors"), Path("b.gguf")])
    with pytest.raises(ValueError, match="unsupported extension"):
        weights_format([Path("model.onnx")])


def _graph_from(weights, k: int, n: int) -> Graph:
    w = weights.layer.weight.allocate(DType.float32, [n, k])
    b = weights.layer.bias.allocate(DType.float32, [n])
    with Graph("linear", input_types=[TensorType(DType.float32, (2, k), DeviceRef.CPU())]) as g:
        x = g.inputs[0]
        g.output(x @ ops.transpose(w, 0, 1) + b)
    return g


def test_end_to_end_safetensors_graph(tmp_path):
    from max.engine import InferenceSession

    rng = torch.Generator().manual_seed(0)
    sd = {"layer.weight": torch.randn(3, 4, generator=rng).to(torch.bfloat16), "layer.bias": torch.randn(3, generator=rng)}
    save_file(sd, str(tmp_path / "model.safetensors"))
    weights = load_weights([tmp_path / "model.safetensors"])
    g = _graph_from(weights, 4, 3)
    model = InferenceSession().load(g, weights_registry=weights.allocated_weights)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    (out,) = model.execute(x)
    ref = x @ sd["layer.weight"].float().numpy().T + sd["layer.bias"].numpy()
    np.testing.assert_allclose(out.to_numpy(), ref, rtol=1e-6, atol=1e-6)


def test_end_to_end_gguf_graph(tmp_path):
    gguf = pytest.importorskip("gguf")
    from max.engine import InferenceSession

    rng = np.random.default_rng(0)
    wt = rng.standard_normal((3, 4)).astype(np.float32)
    bias = rng.standard_normal(3).astype(np.float32)
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_tensor("layer.weight", wt.astype(np.float16))
    w.add_tensor("layer.bias", bias)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    weights = load_weights([tmp_path / "m.gguf"])
    g = _graph_from(weights, 4, 3)  # float16 stored, float32 allocated: converted at load
    model = InferenceSession().load(g, weights_registry=weights.allocated_weights)
    x = np.ones((2, 4), np.float32)
    (out,) = model.execute(x)
    np.testing.assert_allclose(out.to_numpy(), x @ wt.astype(np.float16).astype(np.float32).T + bias, rtol=1e-6)


def test_quantized_weight_binds_as_uint8_blocks(tmp_path):
    """A quantized GGUF weight allocates as uint8 blocks and binds through weights_registry."""
    gguf = pytest.importorskip("gguf")
    from max.engine import InferenceSession
    from max.graph.quantization import QuantizationEncoding

    a = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    w = gguf.GGUFWriter(str(tmp_path / "q.gguf"), "llama")
    w.add_tensor("q.weight", gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    weights = load_weights([tmp_path / "q.gguf"])
    qw = weights.q.weight.allocate(quantization_encoding=QuantizationEncoding.Q8_0)
    assert qw.shape == [2, 68] and qw.dtype == DType.uint8
    with Graph("qg", input_types=[]) as g:
        g.output(ops.cast(qw, DType.int32))
    (out,) = InferenceSession().load(g, weights_registry=weights.allocated_weights).execute()
    assert np.array_equal(out.to_numpy().astype(np.uint8), weights.q.weight.data().to_numpy())
