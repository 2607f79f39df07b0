"""A transformer block graph (RMSNorm -> attention -> residual -> RMSNorm -> SwiGLU MLP -> residual),
hidden 1024, 16 heads, seq 128 (``--seq``), batch 1 and 8, float32: libremax with and without fusion vs torch eager.

Run: .venv/bin/python bench/transformer_block.py
"""

from __future__ import annotations

import math
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import fmt_s, table, timeit  # noqa: E402

from max.driver import Buffer  # noqa: E402
from max.dtype import DType  # noqa: E402
from max.engine import InferenceSession  # noqa: E402
from max.graph import DeviceRef, Graph, TensorType, Weight, ops  # noqa: E402

H, NH, I = 1024, 16, 2816
S = 128  # --seq N changes it (fusion matters more for longer sequences: try --seq 512)
HD = H // NH
EPS = 1e-5


def rms(x, w):
    return x * ops.rsqrt(ops.mean(x * x, axis=-1) + EPS) * w


def build() -> Graph:
    cpu = DeviceRef.CPU()
    W = {n: Weight(n, DType.float32, s, cpu) for n, s in
         [("wq", (H, H)), ("wk", (H, H)), ("wv", (H, H)), ("wo", (H, H)), ("w1", (H, I)), ("w3", (H, I)),
          ("w2", (I, H)), ("n1", (H,)), ("n2", (H,))]}
    with Graph("block", input_types=[TensorType(DType.float32, ("batch", S, H), cpu),
                                     TensorType(DType.float32, (S, S), cpu)]) as g:
        x, mask = g.inputs
        h = rms(x, W["n1"])

        def heads(t):
            return ops.transpose(ops.reshape(t, ["batch", S, NH, HD]), 1, 2)

        q, k, v = heads(h @ W["wq"]), heads(h @ W["wk"]), heads(h @ W["wv"])
        p = ops.softmax(q @ ops.transpose(k, -1, -2) * (1 / math.sqrt(HD)) + mask)
        a = ops.reshape(ops.transpose(p @ v, 1, 2), ["batch", S, H])
        x = x + a @ W["wo"]
        h = rms(x, W["n2"])
        g.output(x + (ops.silu(h @ W["w1"]) * (h @ W["w3"])) @ W["w2"])
    return g


def main() -> None:
    global S
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seq", type=int, default=128, help="sequence length (default 128)")
    S = ap.parse_args().seq
    rng = np.random.default_rng(0)
    shapes = {"wq": (H, H), "wk": (H, H), "wv": (H, H), "wo": (H, H), "w1": (H, I), "w3": (H, I), "w2": (I, H)}
    wts = {n: (rng.standard_normal(s) / math.sqrt(s[0])).astype(np.float32) for n, s in shapes.items()}
    wts["n1"] = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    wts["n2"] = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    mask = np.triu(np.full((S, S), -1e9, np.float32), 1)
    models = {lvl: InferenceSession(optimization_level=lvl).load(build(), weights_registry=wts) for lvl in (0, 1)}
    tw = {n: torch.from_numpy(a) for n, a in wts.items()}
    tmask = torch.from_numpy(mask)

    def eager(x):
        def r(t, w):
            return F.rms_norm(t, (H,), w, EPS)

        b = x.shape[0]
        h = r(x, tw["n1"])
        q, k, v = ((h @ tw[n]).view(b, S, NH, HD).transpose(1, 2) for n in ("wq", "wk", "wv"))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=tmask).transpose(1, 2).reshape(b, S, H)
        x = x + a @ tw["wo"]
        h = r(x, tw["n2"])
        return x + (F.silu(h @ tw["w1"]) * (h @ tw["w3"])) @ tw["w2"]

    rows = []
    for batch in (1, 8):
        xa = rng.standard_normal((batch, S, H)).astype(np.float32)
        xb, mb = Buffer.from_numpy(xa), Buffer.from_numpy(mask)
        xt = torch.from_numpy(xa)
        ref = eager(xt).numpy()
        for lvl, m in models.items():
            np.testing.assert_allclose(m.execute(xb, mb)[0].to_numpy(), ref, rtol=2e-3, atol=2e-3)
        t0 = timeit(lambda: models[0].execute(xb, mb), repeat=7, warmup=2)
        t1 = timeit(lambda: models[1].execute(xb, mb), repeat=7, warmup=2)
        te = timeit(lambda: eager(xt), repeat=7, warmup=2)
        rows.append((batch, fmt_s(t0), fmt_s(t1), fmt_s(te), f"{t0 / t1:.2f}x", f"{t1 / te:.2f}x"))
    s = InferenceSession()
    s.load(build(), weights_registry=wts)
    print("fused kernels:", s.last_compile_stats.get("fused"))
    table(f"Transformer block, hidden {H}, seq {S}, float32, {torch.get_num_threads()} threads (median of 7)", rows,
          ("batch", "no fusion", "fusion", "torch eager", "fusion speed-up", "fusion/torch"))


if __name__ == "__main__":
    main()
