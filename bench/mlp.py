"""MLP block: x @ W1 -> silu -> * (x @ W3) -> @ W2, hidden 1024 -> 2816 -> 1024,
batch 1 and 64, float32, against torch eager and numpy on the same weights.

Run: .venv/bin/python bench/mlp.py
"""

from __future__ import annotations

import sys

import numpy as np
import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import fmt_s, table, timeit  # noqa: E402

from max.driver import Buffer  # noqa: E402
from max.dtype import DType  # noqa: E402
from max.engine import InferenceSession  # noqa: E402
from max.graph import DeviceRef, Graph, TensorType, Weight, ops  # noqa: E402

H, I = 1024, 2816


def main() -> None:
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((H, I)) / np.sqrt(H)).astype(np.float32)
    w3 = (rng.standard_normal((H, I)) / np.sqrt(H)).astype(np.float32)
    w2 = (rng.standard_normal((I, H)) / np.sqrt(I)).astype(np.float32)
    W1 = Weight("w1", DType.float32, (H, I), DeviceRef.CPU())
    W3 = Weight("w3", DType.float32, (H, I), DeviceRef.CPU())
    W2 = Weight("w2", DType.float32, (I, H), DeviceRef.CPU())
    with Graph("mlp", input_types=[TensorType(DType.float32, ("batch", H))]) as g:
        x = g.inputs[0]
        g.output((ops.silu(x @ W1) * (x @ W3)) @ W2)
    m = InferenceSession().load(g, weights_registry={"w1": w1, "w2": w2, "w3": w3})
    t1, t2, t3 = map(torch.from_numpy, (w1, w2, w3))
    rows = []
    for batch in (1, 64):
        xa = rng.standard_normal((batch, H)).astype(np.float32)
        xb = Buffer.from_numpy(xa)
        xt = torch.from_numpy(xa)

        def eager():
            return torch.matmul(torch.nn.functional.silu(xt @ t1) * (xt @ t3), t2)

        def npy():
            a = xa @ w1
            return ((a / (1 + np.exp(-a))) * (xa @ w3)) @ w2

        ref = npy().astype(np.float64)
        np.testing.assert_allclose(m.execute(xb)[0].to_numpy(), ref, rtol=1e-3, atol=1e-3)
        t_ours = timeit(lambda: m.execute(xb), repeat=15, warmup=3)
        t_torch = timeit(eager, repeat=15, warmup=3)
        t_np = timeit(npy, repeat=15, warmup=3)
        rows.append((batch, fmt_s(t_ours), fmt_s(t_torch), fmt_s(t_np), f"{t_ours / t_torch:.2f}x", f"{t_ours / t_np:.2f}x"))
    table(f"MLP block {H}->{I}->{H}, float32, {torch.get_num_threads()} threads (median of 15)", rows,
          ("batch", "libremax", "torch eager", "numpy", "ours/torch", "ours/numpy"))
    print("\nTarget: <= 1.1x torch eager.")


if __name__ == "__main__":
    main()
