"""Quantised matmul over GGML blocks, in plain torch (the reference decoder,
``dequantize``, lives in :mod:`max.graph.quantization.codec`; re-exported here).

``qmatmul(x, blocks, encoding)`` computes ``x @ dequantize(blocks).T``
without materialising the whole float weight.  With ``fast=True`` (default)
Q4_0/Q4_1/Q4_K weights are repacked once (cached per weight tensor) into
torch's int4 group-quantised CPU GEMM (``_weight_int4pack_mm_for_cpu``) run
in bfloat16: activations and the per-32 scales/offsets are rounded to
bfloat16 (relative error ~2**-8 per term, well under the 4-bit weight
error; llama.cpp likewise quantises activations to 8 bits).  Every other
case -- other formats, ``fast=False``, non-CPU tensors -- dequantises the
exact float32 weight tile by tile (``tile_rows`` rows at a time) and
multiplies in float32.

The graph ops (``dequantize``/``qmatmul`` nodes) are registered elsewhere;
this module only provides the functions.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from max.graph.quantization import QuantizationEncoding
from max.graph.quantization.codec import (  # noqa: F401  (dequantize: re-exported)
    _DEQUANT, FLOAT_KINDS, _as_u8, _enc, _half, _nibbles, _scale_min_k4, dequantize, dequantize_blocks)

__all__ = [
    "FLOAT_KINDS",
    "PreparedQWeight",
    "dequantize",
    "dequantize_blocks",
    "prepare_qweight",
    "qmatmul",
]

QK_K = 256


# ------------------------------------------------------------------ qmatmul
_INT4_KINDS = (QuantizationEncoding.Q4_0, QuantizationEncoding.Q4_1, QuantizationEncoding.Q4_K)


class PreparedQWeight:
    """A quantised ``(N, K)`` weight prepared for :func:`qmatmul`.

    ``kind == "int4pack"``: packed for torch's int4 group-wise CPU GEMM (group 32);
    ``kind == "tiles"``: the raw blocks, dequantised ``tile_rows`` rows at a time.
    """

    def __init__(self, blocks: torch.Tensor, encoding: QuantizationEncoding, n: int, k: int, kind: str,
                 packed: torch.Tensor | None = None, scales_zeros: torch.Tensor | None = None) -> None:
        self.blocks = blocks
        self.encoding = encoding
        self.n = n
        self.k = k
        self.kind = kind
        self.packed = packed
        self.scales_zeros = scales_zeros

    @property
    def nbytes(self) -> int:
        """Bytes read per full pass over the weight (what a decode step streams)."""
        if self.kind == "int4pack":
            assert self.packed is not None and self.scales_zeros is not None
            return self.packed.numel() * self.packed.element_size() + self.scales_zeros.numel() * self.scales_zeros.element_size()
        return self.blocks.numel()


def _int4_parts(b: torch.Tensor, enc: QuantizationEncoding) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q in 0..15 per element, scale per 32-group, zero per 32-group) such that w = (q - 8) * scale + zero."""
    n = b.shape[0]
    if enc is QuantizationEncoding.Q4_0:
        d = _half(b[:, 0:2])
        q = _nibbles(b[:, 2:], 16).reshape(n, 32)
        return q, d, torch.zeros_like(d)
    if enc is QuantizationEncoding.Q4_1:
        d = _half(b[:, 0:2])
        m = _half(b[:, 2:4])
        q = _nibbles(b[:, 4:], 16).reshape(n, 32)
        return q, d, m + 8 * d
    # Q4_K: 8 sub-blocks of 32, each w = (d*sc) * q - dmin*mn
    d = _half(b[:, 0:2])
    dmin = _half(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    dd = d * sc.to(torch.float32)
    dm = dmin * mn.to(torch.float32)
    q = _nibbles(b[:, 16:], 32).reshape(n * 8, 32)
    return q, dd.reshape(-1, 1), (8 * dd - dm).reshape(-1, 1)


def _int4pack_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"
    )


def prepare_qweight(blocks: Any, encoding: Any, *, tile_rows: int | None = None) -> PreparedQWeight:
    """Prepare a ``(N, K_bytes)`` block tensor for repeated :func:`qmatmul` calls."""
    enc = _enc(encoding)
    if isinstance(enc, str) or enc not in _DEQUANT:
        raise ValueError(f"qmatmul: {encoding!r} is not a GGML block encoding")
    b = _as_u8(blocks)
    if b.ndim != 2:
        raise ValueError(f"qmatmul: quantised weight must be 2-D (N, bytes_per_row), got shape {tuple(b.shape)}")
    n, row_bytes = int(b.shape[0]), int(b.shape[1])
    if row_bytes % enc.block_size:
        raise ValueError(f"qmatmul: {enc._name_} rows must be a multiple of {enc.block_size} bytes, got {row_bytes}")
    k = row_bytes // enc.block_size * enc.elements_per_block
    if (
        enc in _INT4_KINDS
        and b.device.type == "cpu"
        and _int4pack_available()
        and k % 32 == 0
        and n % 16 == 0  # the int4 packing works on 16-row tiles
    ):
        q, scale, zero = _int4_parts(b.reshape(-1, enc.block_size), enc)
        q = q.reshape(n, k).to(torch.int32)
        g = k // 32
        sz = torch.stack([scale.reshape(n, g), zero.reshape(n, g)], dim=-1).transpose(0, 1).contiguous()
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        # torch's CPU int4 kernel is fast in bfloat16 only (its float32 path is scalar code)
        return PreparedQWeight(b, enc, n, k, "int4pack", packed, sz.to(torch.bfloat16))
    return PreparedQWeight(b, enc, n, k, "tiles")


# id(blocks tensor) -> (weak ref to it, prepared weight).  Keyed by identity: tensors'
# __eq__ is elementwise, so a WeakKeyDictionary cannot hold them.
_PREPARED: dict[int, tuple["weakref.ref[torch.Tensor]", PreparedQWeight]] = {}


def _cached(t: torch.Tensor) -> PreparedQWeight | None:
    hit = _PREPARED.get(id(t))
    return hit[1] if hit is not None and hit[0]() is t else None


def _remember(t: torch.Tensor, w: PreparedQWeight) -> None:
    key = id(t)
    try:
        ref = weakref.ref(t, lambda _r, key=key, d=_PREPARED: d.pop(key, None))
    except TypeError:  # pragma: no cover - tensors support weak references
        return
    _PREPARED[key] = (ref, w)


def qmatmul(x: torch.Tensor, blocks: Any, encoding: Any = None, *, tile_rows: int = 256,
            fast: bool = True) -> torch.Tensor:
    """``x @ dequantize(blocks, encoding).T`` for a ``(N, K_bytes)`` quantised weight.

    ``x``: float ``(..., K)``.  ``blocks``: raw uint8 blocks (a torch tensor is
    prepared once and cached by identity) or a :class:`PreparedQWeight`.
    ``fast``: allow the bfloat16 int4 kernel for Q4 kinds (see the module doc);
    ``False`` always uses the exact float32 weight.
    Returns ``(..., N)`` in ``x``'s dtype.
    """
    if isinstance(blocks, PreparedQWeight):
        w = blocks
    else:
        if encoding is None:
            raise ValueError("qmatmul: encoding is required with raw blocks")
        is_t = isinstance(blocks, torch.Tensor)
        w = _cached(blocks) if is_t else None
        if w is None or w.encoding is not _enc(encoding):
            w = prepare_qweight(blocks, encoding)
            if is_t:
                _remember(blocks, w)
    if x.shape[-1] != w.k:
        raise ValueError(f"qmatmul: x has {x.shape[-1]} features, the {w.encoding._name_} weight has K={w.k}")
    lead = x.shape[:-1]
    if w.kind == "int4pack" and fast and x.device.type == "cpu":
        xb = x.reshape(-1, w.k).to(torch.bfloat16).contiguous()
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, w.packed, 32, w.scales_zeros)
    else:
        x2 = x.reshape(-1, w.k).to(torch.float32)
        y = torch.empty((x2.shape[0], w.n), dtype=torch.float32, device=x2.device)
        tile = torch.empty((min(tile_rows, w.n), w.k), dtype=torch.float32, device=x2.device)
        for s in range(0, w.n, tile_rows):
            e = min(s + tile_rows, w.n)
            t = tile[: e - s]
            dequantize(w.blocks[s:e], w.encoding, out=t)
            y[:, s:e] = x2 @ t.T
    return y.reshape(*lead, w.n).to(x.dtype)
