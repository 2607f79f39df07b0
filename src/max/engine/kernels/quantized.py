"""Kernels for ``max.graph.ops.quantized`` (GGML block decoding lives in ``kernels/quantization.py``)."""

from __future__ import annotations

import torch

from max.engine.kernels import kernel
from max.engine.kernels import quantization as q


@kernel("dequantize")
def dequantize(blocks: torch.Tensor, encoding: str, native: str | None = None) -> torch.Tensor:
    if native and blocks.device.type == "cpu" and blocks.dim() == 2 and blocks.shape[0] <= 256:
        # few rows (an embedding lookup): the decoder of the ``native`` kernel variant, same float32 results
        from max.engine import native as lmx

        kind = lmx.GGML_KINDS.get(encoding)
        if kind is not None:
            so = lmx.library(native)
            enc = q._enc(encoding)
            k = blocks.shape[1] // enc.block_size * enc.elements_per_block
            src = blocks if blocks.is_contiguous() else blocks.contiguous()
            out = torch.empty((blocks.shape[0], k), dtype=torch.float32)
            ok = all(so.lmx_dequant_row(kind, src.data_ptr() + r * src.shape[1], out.data_ptr() + 4 * r * k, k) == 0
                     for r in range(src.shape[0]))
            if ok:
                return out
    return q.dequantize(blocks, encoding)


@kernel("qmatmul")
def qmatmul(x: torch.Tensor, blocks: torch.Tensor, encoding: str, fast: bool = False) -> torch.Tensor:
    # ``fast`` (set at lowering, LIBREMAX_QMATMUL_FAST=1): torch's int4 GEMM, activations rounded to
    # bfloat16 (~1e-2 relative error); off by default so qmatmul stays within float32 tolerance.
    return q.qmatmul(x, blocks, encoding, fast=fast)


@kernel("packed_gather_f32")
def packed_gather_f32(packed: torch.Tensor, idx: torch.Tensor, kind: int, n: int, k: int, native: str) -> torch.Tensor:
    """Rows ``idx`` (any shape, flattened; negative ids count from the end) of a packed ``[n, k]`` weight
    as float32 ``[len(idx), k]``: the GGML dequantisation of those rows, read from the packed layout
    (an embedding lookup on a table that is also packed for the tied output projection; ``native``: the
    kernel variant that packed it)."""
    from max.engine.native import library

    ids = idx.reshape(-1).tolist()
    out = torch.empty((len(ids), k), dtype=torch.float32)
    so, src, dst = library(native), packed.data_ptr(), out.data_ptr()
    for i, row in enumerate(ids):
        r = row + n if row < 0 else row
        if not 0 <= r < n or so.lmx_packed_row(kind, src, n, k, r, dst + 4 * i * k) != 0:
            raise IndexError(f"embedding lookup: index {row} is out of range for a table of {n} rows")
    return out


@kernel("gptq_to_q4_0")
def gptq_to_q4_0(rows: torch.Tensor, k: int, group_size: int) -> torch.Tensor:
    """Symmetric GPTQ rows -> the Q4_0 blocks holding the same values (folded once for a constant weight)."""
    from max.graph.quantization.gptq import gptq_rows_to_q4_0

    return gptq_rows_to_q4_0(rows, k, group_size)


@kernel("pack_qweight")
def pack_qweight(blocks: torch.Tensor, kind: int, n: int, k: int, native: str) -> torch.Tensor:
    """GGML blocks -> the interleaved layout of the ``native`` kernel variant (run once at load by weight
    folding)."""
    from max.engine import native as lmx

    return lmx.pack(blocks, kind, n, k, so=lmx.library(native))
