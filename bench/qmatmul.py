"""Quantised matmul on the CPU: ``qmatmul`` vs dequantise-everything-then-float32-matmul.

    .venv/bin/python bench/qmatmul.py [--n 2048 --k 2048] [--m 1,32] [--threads T]

For each GGML encoding, a random (N, K) weight is quantised (gguf-py for the
legacy kinds; random valid blocks for K-quants) and these are timed:

* ``deq+mm``   dequantise the whole weight, then ``x @ W.T`` in float32 (per call);
* ``f32 mm``   ``x @ W.T`` with an already-dequantised float32 weight (resident, 4 B/weight);
* ``qmatmul``  ``max.engine.kernels.quantization.qmatmul`` on a prepared weight
               (int4 repack + bfloat16 kernel for Q4_0/Q4_1/Q4_K, tiled exact
               float32 dequantise+matmul otherwise).

Times are the best of 15 runs.  Ratios are ``deq+mm / qmatmul`` and ``f32 mm / qmatmul`` (> 1: qmatmul faster).
"bytes/token" is what one decode step (M=1) streams from memory for the weight.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import gguf  # noqa: E402

from max.engine.kernels.quantization import dequantize, prepare_qweight, qmatmul  # noqa: E402

T = gguf.GGMLQuantizationType
KINDS = ["Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q8_0", "Q6_K"]
K_QUANT_SCALE_OFFSETS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,)}


def make_blocks(kind: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    if kind in K_QUANT_SCALE_OFFSETS:
        epb, bs = gguf.GGML_QUANT_SIZES[T[kind]]
        b = rng.integers(0, 256, size=(n, k // epb, bs), dtype=np.uint8)
        for o in K_QUANT_SCALE_OFFSETS[kind]:
            b[:, :, o:o + 2] = np.float16(rng.uniform(1e-3, 2e-2, size=(n, k // epb))).view(np.uint8).reshape(n, -1, 2)
        return b.reshape(n, -1)
    return gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), T[kind])


def timeit(fn, reps: int = 15) -> float:
    """Best of ``reps`` runs (robust to a busy shared machine)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--m", default="1,32")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--kinds", default=",".join(KINDS))
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    n, k = a.n, a.k
    ms = [int(v) for v in a.m.split(",")]
    rng = np.random.default_rng(0)
    print(f"qmatmul vs dequantise+fp32 matmul: weight N={n} x K={k}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, CPU")
    print(f"{'kind':5s} {'path':9s} {'M':>3s} {'deq+mm ms':>10s} {'f32 mm ms':>10s} {'qmatmul ms':>10s} "
          f"{'vs deq+mm':>9s} {'vs f32':>7s} {'bytes/token q':>14s} {'f32':>10s}")
    for kind in a.kinds.split(","):
        blocks = torch.from_numpy(make_blocks(kind, n, k, rng))
        w32 = dequantize(blocks, kind)
        prep = prepare_qweight(blocks, kind)
        for m in ms:
            x = torch.randn(m, k)
            t_deq = timeit(lambda: x @ dequantize(blocks, kind).T)
            t_f32 = timeit(lambda: x @ w32.T)
            t_q = timeit(lambda: qmatmul(x, prep))
            err = float((qmatmul(x, prep) - x @ w32.T).abs().max() / (x @ w32.T).abs().max())
            assert err < (2e-2 if prep.kind == "int4pack" else 1e-4), (kind, err)
            print(f"{kind:5s} {prep.kind:9s} {m:3d} {t_deq * 1e3:10.3f} {t_f32 * 1e3:10.3f} {t_q * 1e3:10.3f} "
                  f"{t_deq / t_q:8.2f}x {t_f32 / t_q:6.2f}x {prep.nbytes:14,d} {w32.numel() * 4:10,d}")


if __name__ == "__main__":
    main()
