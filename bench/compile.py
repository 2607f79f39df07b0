"""Compile time: a 3-op graph (matmul + add + relu) and a 1,000-node graph.

Peer: torch.fx (symbolic_trace + GraphModule codegen) on the equivalent
nn.Module, the cheapest whole-graph capture torch offers; `--torch-compile`
adds torch.compile's first call (Inductor) for scale.
Run: .venv/bin/python bench/compile.py
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import fmt_s, table, timeit  # noqa: E402

from max.dtype import DType  # noqa: E402
from max.engine import InferenceSession  # noqa: E402
from max.engine.compiler import lower as lower_mod  # noqa: E402
from max.graph import DeviceRef, Graph, TensorType, ops  # noqa: E402


def three_op_graph() -> Graph:
    with Graph("three", input_types=[TensorType(DType.float32, (64, 128)), TensorType(DType.float32, (128, 64)),
                                     TensorType(DType.float32, (64,))]) as g:
        x, w, b = g.inputs
        g.output(ops.relu(ops.matmul(x, w) + b))
    return g


def thousand_node_graph() -> Graph:
    with Graph("thousand", input_types=[TensorType(DType.float32, (16, 16))]) as g:
        x = g.inputs[0]
        y = x
        for i in range(250):
            y = ops.tanh(y * 0.5 + x) - 0.25  # 4 nodes per step (constants CSE'd)
        g.output(y)
    return g


class Three(torch.nn.Module):
    def forward(self, x, w, b):
        return torch.relu(torch.matmul(x, w) + b)


class Thousand(torch.nn.Module):
    def forward(self, x):
        y = x
        for _ in range(250):
            y = torch.tanh(y * 0.5 + x) - 0.25
        return y


def ours(build) -> float:
    def run():
        lower_mod._CACHE.clear()
        InferenceSession().load(build())
    return timeit(run, repeat=5)


def ours_cached(build) -> float:
    s = InferenceSession()
    s.load(build())
    return timeit(lambda: s.load(build()), repeat=5)


def fx_peer(mod) -> float:
    return timeit(lambda: torch.fx.symbolic_trace(mod()), repeat=5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--torch-compile", action="store_true", help="also time torch.compile's first call")
    a = ap.parse_args()
    rows = []
    for name, build, mod, args in [
        ("3-op (matmul+add+relu)", three_op_graph, Three,
         (torch.randn(64, 128), torch.randn(128, 64), torch.randn(64))),
        ("1,000-node chain", thousand_node_graph, Thousand, (torch.randn(16, 16),)),
    ]:
        ns = len(build()._nodes)
        t_ours = ours(build)
        t_hit = ours_cached(build)
        t_fx = fx_peer(mod)
        row = [name, ns, fmt_s(t_ours), fmt_s(t_hit), fmt_s(t_fx), f"{t_ours / t_fx:.2f}x"]
        if a.torch_compile:
            import time

            torch._dynamo.reset()
            c = torch.compile(mod())
            t0 = time.perf_counter()
            c(*args)
            tc = time.perf_counter() - t0
            row += [fmt_s(tc), f"{tc / t_ours:.0f}x slower"]
        rows.append(tuple(row))
    hdr = ("graph", "nodes", "libremax load (cold)", "load (cache hit)", "torch.fx trace", "ours/fx")
    if a.torch_compile:
        hdr += ("torch.compile 1st call", "vs ours")
    table("Compile time (median of 5)", rows, hdr)
    print("\nTargets: 3-op < 20 ms, 1,000-node < 1 s (the reference compiler: ~55 s for the 3-op graph).")
    _ = (np, DeviceRef)


if __name__ == "__main__":
    main()
