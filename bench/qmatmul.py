"""Quantised matmul on the CPU: libremax's native kernel beside torch's weight-only int4 kernel,
float32 resident weights, and dequantise-then-matmul.

    .venv/bin/python bench/qmatmul.py [--shapes 576x576,1536x576,49152x576,4864x896] [--m 1,16,128]

For each GGML kind and weight shape (N x K; SmolLM2 and Qwen2.5-0.5B projection shapes by default) a
random weight is quantised (gguf-py for the legacy kinds; random valid blocks for K-quants) and
these are timed (best of repeated runs):

* ``native``   libremax's kernel on the weight repacked once into its interleaved layout (8-bit
               activation codes per 32 values, exact integer sums; every kind);
* ``int4pack`` torch's ``_weight_int4pack_mm_for_cpu`` (bfloat16 activations; Q4_0/Q4_1/Q4_K only,
               which map exactly onto its 32-element groups);
* ``f32``      ``x @ W.T`` with the weight dequantised once to float32 (4 bytes per weight);
* ``deq+mm``   dequantise the whole weight in torch, then the float32 matmul (per call).

* ``torch``    the fallback the cost model (``engine/native/cost.py``) switches to at large M: blocks of
               rows dequantised / widened into a reused float32 buffer, one torch GEMM per block;

Dense float32/bfloat16/float16 weights (``--kinds F32,BF16``) run the small-M float kernel beside
the same torch fallback.  ``--isa all`` times every kernel variant this CPU can execute; the
``cost model`` column says which of native and torch runs that row in the engine.

``--baseline LIB`` also times a previously built kernel library (e.g. a copy of
``~/.cache/libremax/native/libremax_kernels_avx2_*.so`` from before a change, same variant as
``--isa``) on the same packed weights, alternating with the current build, and says whether the
two give the same bits.

``--working-set MB`` times every call over many distinct copies of the weight totalling at least MB
megabytes (e.g. 640, more than the L3 cache), cycled in turn, as a real decode step streams each layer's
weights from memory; without it one weight is timed repeatedly (resident in cache when it fits).
``GFLOP/s`` is 2 M N K / time of the native kernel, ``GB/s`` the weight bytes it read per second.

Ratios are time(peer) / time(native): > 1 means the native kernel is faster.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gguf  # noqa: E402
from _common import table  # noqa: E402

from max.dtype import DType  # noqa: E402
from max.engine.backend import BackendPolicy  # noqa: E402
from max.engine import native  # noqa: E402
from max.engine.kernels.quantization import dequantize, prepare_qweight, qmatmul  # noqa: E402

T = gguf.GGMLQuantizationType
KINDS = ["Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_K", "Q6_K", "Q8_0"]
DENSE = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
K_QUANT_SCALE_OFFSETS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,)}


def make_blocks(kind: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    if kind in K_QUANT_SCALE_OFFSETS:
        epb, bs = gguf.GGML_QUANT_SIZES[T[kind]]
        b = rng.integers(0, 256, size=(n, k // epb, bs), dtype=np.uint8)
        for o in K_QUANT_SCALE_OFFSETS[kind]:
            b[:, :, o:o + 2] = np.float16(rng.uniform(1e-3, 2e-2, size=(n, k // epb))).view(np.uint8).reshape(n, -1, 2)
        return b.reshape(n, -1)
    return gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), T[kind])


def timeit(fn, budget: float = 0.25) -> float:
    """Best time of runs within ``budget`` seconds (robust to a busy shared machine)."""
    fn()
    best, t_end = float("inf"), time.perf_counter() + budget
    while True:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best = min(best, dt)
        if t0 + dt > t_end:
            return best


def _copy_like_model(w: torch.Tensor) -> torch.Tensor:
    """A copy of a packed weight in memory of the kind the engine keeps packed weights in."""
    out = native.huge_empty(w.numel())
    out.copy_(w)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="576x576,1536x576,576x1536,49152x576,4864x896,896x4864")
    ap.add_argument("--m", default="1,16,128")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help="GGML kinds, and/or the dense dtypes F32, BF16, F16 (the small-M float kernel)")
    ap.add_argument("--isa", default="native",
                    help="native kernel variant(s): 'native', 'all' (every variant this CPU runs) or a list")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--skip-deq", action="store_true", help="leave out dequantise-then-matmul (slow)")
    ap.add_argument("--working-set", type=float, default=0.0,
                    help="cycle over distinct weight copies of at least this many MB (0: one resident weight)")
    ap.add_argument("--baseline", default=None,
                    help="a kernel library built before a change (same variant as --isa): timed beside it")
    a = ap.parse_args()
    from max.engine import threads
    from max.engine.kernels.fused import _blockwise_linear
    from max.engine.native import build

    threads.apply(a.threads or threads.default_num_threads())
    isas = build.runnable() if a.isa == "all" else [build.choose(v) for v in a.isa.split(",")]
    base_so = None
    if a.baseline:
        import ctypes
        import types

        base_so = ctypes.CDLL(os.path.abspath(a.baseline), mode=ctypes.RTLD_LOCAL)

        class _OlderLibrary:  # a build from before a kernel was added: its missing symbols are skipped
            def __getattr__(self, name: str):  # noqa: ANN204
                return getattr(base_so, name) if hasattr(base_so, name) else types.SimpleNamespace()

        native._declare(_OlderLibrary())
        if hasattr(base_so, "lmx_set_act_refine"):  # the same activation refinement as the current build
            fr = native.act_refine()
            base_so.lmx_set_act_refine(fr.numerator, fr.denominator)
            if hasattr(base_so, "lmx_set_act_refine_threshold"):
                base_so.lmx_set_act_refine_threshold(ctypes.c_float(native.act_refine_threshold()))
    rng = np.random.default_rng(0)
    rows = []
    for kind in a.kinds.split(","):
        dense = kind in DENSE
        for shape in a.shapes.split(","):
            n, k = (int(v) for v in shape.split("x"))
            if not dense and k % (256 if kind in K_QUANT_SCALE_OFFSETS else 32):
                continue
            if dense:
                w = torch.randn(n, k).to(DENSE[kind])
                w32, code, mode, wk = w.float(), native.dense_kind(w.dtype), "dense", "dense"
                prep, blocks = None, None
                copies = max(1, int(a.working_set * 1e6 / (w.numel() * w.element_size()) + 0.999))
                ws = [w] + [torch.randn(n, k).to(DENSE[kind]) for _ in range(copies - 1)]
            else:
                code = native.GGML_KINDS[kind]
                blocks = torch.from_numpy(make_blocks(kind, n, k, rng))
                w, mode, wk = native.pack(blocks, code, n, k), "packed", "packed:" + kind
                w32 = dequantize(blocks, kind)
                prep = prepare_qweight(blocks, kind)
                copies = max(1, int(a.working_set * 1e6 / w.numel() + 0.999))
                ws = [w] + [_copy_like_model(w) for _ in range(copies - 1)]  # the same bits, distinct memory
            for isa in isas:
                plans = [native.MatmulPlan([wi], [code], [mode], [n], k, so=native.lib(isa)) for wi in ws]
                plan = plans[0]
                bplans = None if base_so is None else \
                    [native.MatmulPlan([wi], [code], [mode], [n], k, so=base_so) for wi in ws]
                bplan = None if bplans is None else bplans[0]
                nc = len(ws)

                def each(fn):  # one call per weight copy; timeit's result divided by nc
                    def run():
                        for i in range(nc):
                            fn(i)
                    return run

                budget = 0.25 if nc == 1 else 1.0
                for m in (int(v) for v in a.m.split(",")):
                    x = torch.randn(m, k)
                    out = torch.empty(m, n)
                    t_nat = timeit(each(lambda i: plans[i](x, out)), budget) / nc
                    base_cols = ()
                    if bplan is not None:  # alternate, so both see the same machine load
                        t_b = min(timeit(each(lambda i: bplans[i](x, out)), budget),
                                  timeit(each(lambda i: bplans[i](x, out)), budget)) / nc
                        t_nat = min(t_nat, timeit(each(lambda i: plans[i](x, out)), budget) / nc)
                        same = "yes" if torch.equal(bplan(x), plan(x)) else "NO"
                        base_cols = (f"{t_b * 1e6:.1f}", f"{t_b / t_nat:.2f}x", same)
                    if nc == 1:
                        t_f32 = timeit(lambda: torch.nn.functional.linear(x, w32))
                    elif dense and w.dtype == torch.float32:
                        t_f32 = timeit(each(lambda i: torch.nn.functional.linear(x, ws[i])), budget) / nc
                    else:
                        t_f32 = None  # (no float32 copies of the working set)
                    if dense and w.dtype == torch.float32:
                        t_blk = t_f32
                    else:
                        t_blk = timeit(each(lambda i: _blockwise_linear(x, ws[i], wk, n, k)), budget) / nc
                    t_i4 = timeit(lambda: qmatmul(x, prep)) if prep is not None and prep.kind == "int4pack" else None
                    t_deq = None if dense or a.skip_deq or n * k > 30e6 else \
                        timeit(lambda: x @ dequantize(blocks, kind).T, 0.1)
                    ref = x.double() @ w32.double().T
                    err = float((plan(x).double() - ref).abs().max() / ref.abs().max())
                    gbs = (w.numel() * w.element_size()) / t_nat / 1e9
                    gflops = 2 * m * n * k / t_nat / 1e9
                    wdt = {torch.float32: DType.float32, torch.bfloat16: DType.bfloat16,
                           torch.float16: DType.float16}.get(w.dtype, DType.uint8)
                    lim = BackendPolicy(native=True, isa=isa).matmul_choice((wk,), [wdt], DType.float32,
                                                                            True).native_max_m
                    pick = "native" if m < lim else "torch"
                    rows.append((kind, f"{n}x{k}", isa, m, f"{t_nat * 1e6:.1f}", f"{gflops:.0f}", f"{gbs:.1f}",
                                 f"{t_blk / t_nat:.2f}x", pick, f"{t_i4 / t_nat:.2f}x" if t_i4 else "-",
                                 f"{t_f32 / t_nat:.2f}x" if t_f32 else "-",
                                 f"{t_deq / t_nat:.1f}x" if t_deq else "-", f"{err:.1e}", *base_cols))
    where = f"weights cycled over >= {a.working_set:.0f} MB" if a.working_set else "one resident weight"
    table(f"native matmul, {torch.get_num_threads()} threads, {where} (ratios: peer time / native time; 'torch' = "
          "the fallback the cost model picks at large M: GEMM over blocks of rows widened to float32)", rows,
          ("kind", "N x K", "kernels", "M", "native us", "GFLOP/s", "GB/s", "torch", "cost model", "int4pack", "f32", "deq+mm",
           "rel err", *(("baseline us", "vs baseline", "same bits") if base_so is not None else ())))


if __name__ == "__main__":
    main()
