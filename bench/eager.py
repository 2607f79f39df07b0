"""Eager op overhead: ``x = x + y`` (and a few other ops) 1,000 times on small
tensors with ``max.experimental.tensor.Tensor``, against torch eager on the
same data in the same process.  Prints microseconds per op and the ratio.

Run: .venv/bin/python bench/eager.py
"""

from __future__ import annotations

import sys

import numpy as np
import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import table, timeit  # noqa: E402

from max.driver import CPU  # noqa: E402
from max.dtype import DType  # noqa: E402
from max.experimental import functional as F  # noqa: E402
from max.experimental.tensor import Tensor  # noqa: E402

N = 1000


def loop(step, x0):
    def run():
        x = x0
        for _ in range(N):
            x = step(x)
        return x

    return run


def main() -> None:
    torch.set_num_threads(1)
    rows = []
    rng = np.random.default_rng(0)
    for shape in ((4,), (64, 64)):
        a = rng.standard_normal(shape).astype(np.float32) * 1e-3
        b = rng.standard_normal(shape).astype(np.float32) * 1e-3
        xm, ym = Tensor.constant(a, dtype=DType.float32, device=CPU()), Tensor.constant(b, dtype=DType.float32, device=CPU())
        xt, yt = torch.from_numpy(a.copy()), torch.from_numpy(b.copy())
        cases = [
            ("x + y", lambda x: x + ym, lambda x: x + yt),
            ("x * 2.0", lambda x: x * 2.0, lambda x: x * 2.0),
            ("F.exp(x)", lambda x: F.exp(x), lambda x: torch.exp(x)),
            ("F.relu(x - y)", lambda x: F.relu(x - ym), lambda x: torch.relu(x - yt)),
        ]
        for name, ours, ref in cases:
            # same values: check the eager result against torch once
            got = np.asarray(loop(ours, xm)())
            want = loop(ref, xt)().numpy()
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
            n_ops = 2 if name.startswith("F.relu") else 1
            t_ours = timeit(loop(ours, xm), repeat=9, warmup=2) / (N * n_ops)
            t_torch = timeit(loop(ref, xt), repeat=9, warmup=2) / (N * n_ops)
            rows.append((str(shape), name, f"{t_ours * 1e6:.2f}", f"{t_torch * 1e6:.2f}", f"{t_ours / t_torch:.2f}x"))
    table(f"Eager ops, {N} per loop, float32 CPU, 1 thread (median of 9; us per op)", rows,
          ("shape", "op", "libremax us", "torch us", "ours/torch"))
    # lazy: the same loop staged into the compute graph, then compiled and run once
    from max.experimental import tensor as T

    x0, y0 = Tensor.zeros((4,), device=CPU()), Tensor.ones((4,), device=CPU())

    def lazy_loop():
        x = x0
        with T.lazy():
            for _ in range(N):
                x = x + y0
        return np.asarray(x)

    t_lazy = timeit(lazy_loop, repeat=5, warmup=1) / N
    print(f"\nlazy x + y on (4,), {N} ops staged then realized with one compiled graph: "
          f"{t_lazy * 1e6:.2f} us per op (type rule per op + compile-cache lookup + run)")
    fns = [F.add, F.mul, F.exp, F.relu, F.sub]
    print(f"\nmemoised recipes: {sum(len(f._memo) for f in fns)} (one per op and argument types; no per-call recompiles)")
    print("Target: <= 3x torch eager per op.")


if __name__ == "__main__":
    main()
