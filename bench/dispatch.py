"""Per-node dispatch overhead: a chain of 1,000 small adds, µs per node,
against the same 1,000 torch.add calls in eager mode (and numpy).

Run: .venv/bin/python bench/dispatch.py
"""

from __future__ import annotations

import sys

import numpy as np
import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import table, timeit  # noqa: E402

from max.driver import Buffer  # noqa: E402
from max.dtype import DType  # noqa: E402
from max.engine import InferenceSession  # noqa: E402
from max.graph import Graph, TensorType  # noqa: E402

N = 1000


def main() -> None:
    torch.set_num_threads(1)
    rows = []
    for shape in [(4,), (64, 64)]:
        with Graph("adds", input_types=[TensorType(DType.float32, shape), TensorType(DType.float32, shape)]) as g:
            x, y = g.inputs
            acc = x
            for _ in range(N):
                acc = acc + y
            g.output(acc)
        m = InferenceSession().load(g)
        xa = np.ones(shape, np.float32)
        ya = np.full(shape, 1e-3, np.float32)
        xb, yb = Buffer.from_numpy(xa), Buffer.from_numpy(ya)
        xt, yt = torch.from_numpy(xa), torch.from_numpy(ya)

        def eager():
            acc = xt
            for _ in range(N):
                acc = torch.add(acc, yt)
            return acc

        def npy():
            acc = xa
            for _ in range(N):
                acc = np.add(acc, ya)
            return acc

        t_ours = timeit(lambda: m.execute(xb, yb), repeat=9)
        t_torch = timeit(eager, repeat=9)
        t_np = timeit(npy, repeat=9)
        np.testing.assert_allclose(m.execute(xb, yb)[0].to_numpy(), eager().numpy(), rtol=1e-5)
        rows.append((
            str(shape), f"{t_ours / N * 1e6:.2f}", f"{t_torch / N * 1e6:.2f}", f"{t_np / N * 1e6:.2f}",
            f"{(t_ours - t_torch) / N * 1e6:+.2f}", f"{t_ours / t_torch:.2f}x",
        ))
    table(f"Dispatch: chain of {N} adds (µs per node, median of 9)", rows,
          ("shape", "libremax", "torch eager", "numpy", "overhead vs torch", "ratio"))
    print("\nTarget: < 5 µs per node.")


if __name__ == "__main__":
    main()
