"""conv2d / max_pool2d / avg_pool2d: our NHWC graphs against torch eager NCHW on the same data.

Shapes are ResNet-style layers (stem 7x7/2, 3x3 bottleneck convs, a depthwise
conv, a 1x1 projection) and the pools that follow them, float32.  torch runs
``F.conv2d`` / ``F.max_pool2d`` / ``F.avg_pool2d`` on contiguous NCHW tensors (its
default) and on channels_last tensors (the kernels our NHWC graphs reach);
libremax runs a compiled one-op graph on contiguous NHWC inputs (RSCF filters)
through ``Model.execute`` (input checks and dispatch included).  Results are
checked against each other before timing.

Run: .venv/bin/python bench/conv.py [--device gpu]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import fmt_s, table  # noqa: E402

from max import driver  # noqa: E402
from max.driver import Buffer  # noqa: E402
from max.dtype import DType  # noqa: E402
from max.engine import InferenceSession  # noqa: E402
from max.graph import DeviceRef, Graph, TensorType, ops  # noqa: E402

# name, (N, H, W, C), (kh, kw, C/groups, F), stride, padding (h_b, h_a, w_b, w_a), groups
CONVS = [
    ("stem 7x7/2", (1, 224, 224, 3), (7, 7, 3, 64), 2, (3, 3, 3, 3), 1),
    ("3x3 c64", (8, 56, 56, 64), (3, 3, 64, 64), 1, (1, 1, 1, 1), 1),
    ("3x3/2 c128", (8, 56, 56, 128), (3, 3, 128, 128), 2, (1, 1, 1, 1), 1),
    ("1x1 c256->64", (8, 56, 56, 256), (1, 1, 256, 64), 1, (0, 0, 0, 0), 1),
    ("dw 3x3 c256", (8, 28, 28, 256), (3, 3, 1, 256), 1, (1, 1, 1, 1), 256),
    ("3x3 c64 asym-pad", (8, 56, 56, 64), (3, 3, 64, 64), 1, (0, 2, 0, 2), 1),
]
# name, (N, H, W, C), kernel, stride, padding
POOLS = [
    ("max 3x3/2 (stem)", (8, 112, 112, 64), (3, 3), 2, 1),
    ("max 2x2/2", (8, 56, 56, 256), (2, 2), 2, 0),
    ("avg 3x3/1 pad 1", (8, 28, 28, 256), (3, 3), 1, 1),
    ("avg 7x7 (global)", (8, 7, 7, 2048), (7, 7), 1, 0),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    args = ap.parse_args()
    gpu = args.device == "gpu"
    dref = DeviceRef.GPU() if gpu else DeviceRef.CPU()
    tdev = torch.device("cuda") if gpu else torch.device("cpu")
    devs = [driver.CPU()] + ([driver.Accelerator()] if gpu else [])
    sess = InferenceSession(devices=devs)
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    rng = np.random.default_rng(0)

    def place(a: np.ndarray):
        b = Buffer.from_numpy(np.ascontiguousarray(a))
        return b.to(devs[-1]) if gpu else b

    def time_alternately(*fns, repeat: int = 21):
        """Median seconds of each function, timed in turn so load changes hit all of them alike."""
        for _ in range(3):
            for f in fns:
                f()
        sync()
        samples: list[list[float]] = [[] for _ in fns]
        for _ in range(repeat):
            for f, acc in zip(fns, samples):
                t0 = time.perf_counter()
                f()
                sync()
                acc.append(time.perf_counter() - t0)
        return [statistics.median(acc) for acc in samples]

    def row(label, xs, t_o, t_t, t_cl):
        return (label, "x".join(map(str, xs)), fmt_s(t_o), fmt_s(t_t), fmt_s(t_cl), f"{t_o / t_t:.2f}x",
                f"{t_o / t_cl:.2f}x")

    rows = []
    for name, xs, ws, stride, pad, groups in CONVS:
        x = rng.standard_normal(xs).astype(np.float32)
        w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[:3]))).astype(np.float32)
        with Graph("conv", input_types=[TensorType(DType.float32, xs, dref), TensorType(DType.float32, ws, dref)]) as g:
            g.output(ops.conv2d(g.inputs[0].tensor, g.inputs[1].tensor, stride=(stride, stride), padding=pad,
                                groups=groups))
        m = sess.load(g)
        xb, wb = place(x), place(w)
        xt = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous().to(tdev)
        wt = torch.from_numpy(w).permute(3, 2, 0, 1).contiguous().to(tdev)
        sym = pad[0] == pad[1] and pad[2] == pad[3]

        def eager(xt=xt, wt=wt, stride=stride, pad=pad, groups=groups, sym=sym):
            if sym:
                return F.conv2d(xt, wt, None, stride, (pad[0], pad[2]), 1, groups)
            return F.conv2d(F.pad(xt, (pad[2], pad[3], pad[0], pad[1])), wt, None, stride, 0, 1, groups)

        ours = m.execute(xb, wb)[0].to_numpy()
        np.testing.assert_allclose(ours, eager().permute(0, 2, 3, 1).cpu().numpy(), rtol=2e-3, atol=2e-3)
        xcl = xt.contiguous(memory_format=torch.channels_last)
        t_o, t_t, t_cl = time_alternately(lambda m=m, xb=xb, wb=wb: m.execute(xb, wb), eager,
                                          lambda e=eager, xcl=xcl: e(xt=xcl))
        rows.append(row(f"conv2d {name}", xs, t_o, t_t, t_cl))

    for name, xs, k, stride, pad in POOLS:
        kind = name.split()[0]
        x = rng.standard_normal(xs).astype(np.float32)
        op = ops.max_pool2d if kind == "max" else ops.avg_pool2d
        with Graph("pool", input_types=[TensorType(DType.float32, xs, dref)]) as g:
            g.output(op(g.inputs[0].tensor, k, stride, 1, pad))
        m = sess.load(g)
        xb = place(x)
        xt = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous().to(tdev)
        tf = F.max_pool2d if kind == "max" else F.avg_pool2d

        def eager(xt=xt, tf=tf, k=k, stride=stride, pad=pad):
            return tf(xt, k, stride, pad)

        ours = m.execute(xb)[0].to_numpy()
        np.testing.assert_allclose(ours, eager().permute(0, 2, 3, 1).cpu().numpy(), rtol=1e-4, atol=1e-5)
        xcl = xt.contiguous(memory_format=torch.channels_last)
        t_o, t_t, t_cl = time_alternately(lambda m=m, xb=xb: m.execute(xb), eager, lambda e=eager, xcl=xcl: e(xt=xcl))
        rows.append(row(f"{kind}_pool2d {name}", xs, t_o, t_t, t_cl))

    where = torch.cuda.get_device_name() if gpu else f"CPU, {torch.get_num_threads()} threads"
    table(f"conv/pool, float32, ours NHWC graph vs torch eager (NCHW and channels_last), {where} (median of 21, timed alternately)", rows,
          ("op", "input NHWC", "libremax", "torch NCHW", "torch CL", "ours/NCHW", "ours/CL"))
    print("\n< 1 means libremax is faster.  torch NCHW: torch eager on contiguous NCHW tensors (its default);"
          "\ntorch CL: torch eager on channels_last tensors, the kernels our NHWC graphs reach, so ours/CL is"
          "\nour overhead (Model.execute, layout views, filter permute).")


if __name__ == "__main__":
    main()
