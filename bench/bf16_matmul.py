"""bfloat16 matmul on the CPU: torch's native bf16 GEMM vs libremax vs float32, for an MLP-sized product.

libremax uses torch's bf16 GEMM when the CPU has bf16 matrix instructions (AVX512-BF16/AMX, read from
/proc/cpuinfo) and otherwise computes in float32 and rounds back (torch's bf16 GEMM is up to ~100x
slower than float32 on CPUs without them).

Run: .venv/bin/python bench/bf16_matmul.py
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
from max.graph import Graph, TensorType, ops  # noqa: E402


def main() -> None:
    rows = []
    for m, k, n in [(1, 1024, 2816), (64, 1024, 2816)]:
        a = torch.randn(m, k).to(torch.bfloat16)
        b = torch.randn(k, n).to(torch.bfloat16)
        with Graph("bf16mm", input_types=[TensorType(DType.bfloat16, (m, k)), TensorType(DType.bfloat16, (k, n))]) as g:
            g.output(ops.matmul(*g.inputs))
        model = InferenceSession().load(g)
        ab, bb = Buffer._from_torch(a), Buffer._from_torch(b)
        t_native = timeit(lambda: torch.matmul(a, b), repeat=5)
        t_ours = timeit(lambda: model.execute(ab, bb), repeat=5)
        af, bf = a.float(), b.float()
        t_f32 = timeit(lambda: torch.matmul(af, bf), repeat=5)
        ref = torch.matmul(af.double(), bf.double())
        err = (model.execute(ab, bb)[0]._torch().double() - ref).abs().max().item()
        rows.append((f"{m}x{k} @ {k}x{n}", fmt_s(t_native), fmt_s(t_ours), fmt_s(t_f32),
                     f"{t_native / t_ours:.1f}x", f"{err:.3g}"))
    table(f"bf16 matmul on CPU ({torch.get_num_threads()} threads)", rows,
          ("shape", "torch bf16 native", "libremax bf16", "torch float32", "libremax speed-up", "max |err| vs f64"))
    _ = np


if __name__ == "__main__":
    main()
