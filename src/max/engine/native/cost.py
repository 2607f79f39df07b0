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

Thresholds (the smallest M from which torch runs) come from ``bench/qmatmul.py --isa avx512,avx2 --kinds
F32,BF16 --shapes 1536x576,576x1536 --threads 1`` on an AVX-512 host (SmolLM2's projection shapes; one
thread, because two-thread timings on the shared host were dominated by a descheduled OpenMP thread),
each weight both resident in cache and cycled over 640 MB of distinct copies (``--working-set 640``,
more than the 480 MB L3, as a real decode step streams its layers).  The dense kernel is register-tiled
(dense.c) and runs at 113-170 GFLOP/s per AVX-512 core in cache, 85-100 per AVX2 core.

* AVX-512, float32: native/torch time 2.4-2.7x faster at M = 8, 1.4x at 16, 1.1x at 32, 1.0x at 48,
  0.93-0.98x at 64 and 0.85x at 128 in cache; 1.4-1.7x faster up to 48 and 0.9-1.1x at 64 over L3.
  Torch from 64.
* AVX-512, bfloat16 (torch widens blocks of rows first): 2.1x at 16, 1.5x at 32, 1.2-1.3x at 64,
  1.0x at 128 and 0.8-0.96x at 256 in cache; 1.3x at 128 over L3.  Torch from 128.
* AVX2 (torch limited to AVX2 too: ``MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2``; on this
  host torch otherwise uses AVX-512 against the forced AVX2 kernels): float32 1.2x at 16, 1.0x at 32,
  0.85x at 64; bfloat16 1.3x at 16, 1.2x at 32, 1.0x at 64, 0.9x at 128.  Torch from 32 (float32) and
  64 (half).  NEON (not measured: tested under qemu only) takes the AVX2 thresholds.
* Quantised weights stay 1.0-1.4x (AVX2) and 5-6x (AVX-512) faster than dequantise-per-block + GEMM
  at M = 128 (``--kinds Q4_1,Q4_K,Q8_0``).
* The portable variant loses to torch everywhere but quantised M < 8 (1.4-2.2x faster at M = 1).
"""

from __future__ import annotations

# storage -> smallest M at which torch beats the native kernel (None: native at every M)
_AVX512 = {"f32": 64, "half": 128, "quant": None}
_SIMD = {"f32": 32, "half": 64, "quant": None}  # avxvnni, avx2, neondot, neon
_PORTABLE = {"f32": 1, "half": 1, "quant": 8}


def torch_from(isa: str, storage: str) -> int | None:
    """The smallest M from which torch runs a projection whose weights are stored as ``storage`` under
    kernel variant ``isa`` (``None``: the native kernel at every M)."""
    if isa == "torch":
        return 1
    table = _PORTABLE if isa == "generic" else _AVX512 if isa == "avx512" else _SIMD
    return table[storage]


def native_max_m(isa: str, storages: "tuple[str, ...] | list[str]") -> int:
    """Projections of these weights (one fused call) run natively for M below this (1 << 62: always)."""
    limits = [t for t in (torch_from(isa, s) for s in storages) if t is not None]
    return min(limits) if limits else 1 << 62


