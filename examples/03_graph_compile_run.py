"""Build a small graph with a symbolic batch dim, compile it, run it at two batch sizes."""

import time

import numpy as np

from max.driver import Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, Graph, TensorType, Weight, ops

W = Weight("proj.weight", DType.float32, (4, 8), DeviceRef.CPU())  # (out, in) like nn.Linear


def forward(x):
    h = ops.matmul(x, W.T)  # (batch, 4)
    return ops.relu(h) + 1.0


graph = Graph("tiny_linear", forward, input_types=[TensorType(DType.float32, ("batch", 8), DeviceRef.CPU())])
print(graph)

weights = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
t0 = time.perf_counter()
model = InferenceSession().load(graph, weights_registry={"proj.weight": weights})
print(f"compiled in {(time.perf_counter() - t0) * 1e3:.2f} ms; inputs: {model.input_metadata}")

for batch in (2, 5):
    x = np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)
    (out,) = model.execute(Buffer.from_numpy(x))
    ref = np.maximum(x @ weights.T, 0) + 1
    assert np.allclose(out.to_numpy(), ref, atol=1e-5)
    print(f"batch {batch}: output {out.shape}, matches numpy")
