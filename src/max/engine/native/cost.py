"""The one cost model of CPU projections: which kernel runs ``x [M, K] @ W^T`` -- the native variant
in use, or torch (oneDNN/MKL GEMM, vectorised for whatever CPU it finds).

A projection's weights are stored as ``"f32"``, ``"half"`` (bfloat16/float16, widened exactly as they
are read) or ``"quant"`` (GGML blocks, packed).  The native kernels stream the weight once per call,
which wins while M is small (decode); torch's GEMM reuses each weight element across many rows, which
wins at large M (prefill, big batches) for float weights.  Quantised weights on a SIMD variant stay
native at every M: their integer dot products (VNNI / vpmaddubsw / SDOT) do 4x the work of a float FMA
per instruction and read 4-8x fewer bytes, so dequantising for torch never paid (bench/qmatmul.py
prints both).  The portable C variant has no SIMD at all: torch runs everything there except small-M
quantised projections (a weight dequantised per call costs more than the scalar integer kernel).

Thresholds (the smallest M from which torch runs) come from ``bench/qmatmul.py --isa all --kinds
Q4_1,Q4_K,Q8_0,F32,BF16`` on an AVX-512 host (the AVX2 variant forced): float32 weights tie at M = 32
and torch is 1.4-2x faster at 128; bfloat16 weights (widened per block for torch) tie at 64; quantised
weights stay 1.0-1.4x (AVX2) and 5-6x (AVX-512) faster than dequantise-per-block + GEMM at M = 128.
The portable variant loses to torch everywhere but quantised M < 8 (1.4-2.2x faster at M = 1).
They are the same for every SIMD variant.
"""

from __future__ import annotations

# storage -> smallest M at which torch beats the native kernel (None: native at every M)
_SIMD = {"f32": 32, "half": 64, "quant": None}
_PORTABLE = {"f32": 1, "half": 1, "quant": 8}


def torch_from(isa: str, storage: str) -> int | None:
    """The smallest M from which torch runs a projection whose weights are stored as ``storage`` under
    kernel variant ``isa`` (``None``: the native kernel at every M)."""
    if isa == "torch":
        return 1
    table = _PORTABLE if isa == "generic" else _SIMD
    return table[storage]


def native_max_m(isa: str, storages: "tuple[str, ...] | list[str]") -> int:
    """Projections of these weights (one fused call) run natively for M below this (1 << 62: always)."""
    limits = [t for t in (torch_from(isa, s) for s in storages) if t is not None]
    return min(limits) if limits else 1 << 62


