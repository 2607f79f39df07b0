"""GGML block dequantisation and quantised matmul, in plain torch.

``dequantize(blocks, encoding)`` turns a raw ``uint8`` block tensor of shape
``(*rows, bytes_per_row)`` into float32 values of shape
``(*rows, bytes_per_row // block_size * elements_per_block)``.  Every format
is decoded with whole-tensor operations (no Python loop over blocks; large
tensors are processed in chunks of blocks to bound temporaries) and performs
the same float32 operations in the same order as ``gguf.quants.dequantize``,
so the results are bit-identical to it.

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
from typing import Any, Callable

import numpy as np
import torch

from max.graph.quantization import QuantizationEncoding

__all__ = [
    "FLOAT_KINDS",
    "PreparedQWeight",
    "dequantize",
    "dequantize_blocks",
    "prepare_qweight",
    "qmatmul",
]

QK_K = 256
# Float "kinds" accepted besides QuantizationEncoding: raw bytes viewed as these.
FLOAT_KINDS = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}

# Blocks decoded per chunk: bounds the temporaries (a few times 256 * 4 bytes per block).
_CHUNK_BLOCKS = 1 << 14


def _enc(encoding: Any) -> QuantizationEncoding | str:
    if isinstance(encoding, QuantizationEncoding):
        return encoding
    name = getattr(encoding, "name", encoding)  # gguf.GGMLQuantizationType or str
    if isinstance(name, str):
        up = name.upper()
        if up in FLOAT_KINDS:
            return up
        if up in QuantizationEncoding.__members__:
            return QuantizationEncoding[up]
    raise ValueError(
        f"dequantize: unknown encoding {encoding!r}; expected a QuantizationEncoding or one of "
        f"{sorted(FLOAT_KINDS) + [e._name_ for e in QuantizationEncoding if e.is_gguf]}"
    )


def _as_u8(blocks: Any) -> torch.Tensor:
    if isinstance(blocks, np.ndarray):
        arr = np.ascontiguousarray(blocks).view(np.uint8)
        if not arr.flags.writeable:  # read-only maps: torch warns, but these views are only read
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return torch.from_numpy(arr)
        blocks = torch.from_numpy(arr)
    elif not isinstance(blocks, torch.Tensor):
        _torch = getattr(blocks, "_torch", None)
        blocks = _torch() if callable(_torch) else torch.from_dlpack(blocks)
    if blocks.dtype != torch.uint8:
        blocks = blocks.contiguous().view(torch.uint8)
    return blocks


def _half(b: torch.Tensor) -> torch.Tensor:
    """(n, 2) uint8 -> (n, 1) float32 via float16."""
    return b.contiguous().view(torch.float16).to(torch.float32)


_SH_04 = None  # built lazily per device


def _shifts(vals: list[int], shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(vals, dtype=torch.uint8, device=device).reshape(shape)


def _nibbles(qs: torch.Tensor, group: int) -> torch.Tensor:
    """Low nibbles of each ``group`` bytes, then their high nibbles: (n, m*group) -> (n, m, 2, group)."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, group) >> _shifts([0, 4], (1, 1, 2, 1), qs.device)
    return q & 0x0F


def _dq_q4_0(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _half(b[:, 0:2])
    q = _nibbles(b[:, 2:], 16).reshape(n, 32).to(torch.int8) - 8
    return d * q.to(torch.float32)


def _dq_q4_1(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _half(b[:, 0:2])
    m = _half(b[:, 2:4])
    q = _nibbles(b[:, 4:], 16).reshape(n, 32).to(torch.float32)
    return (d * q) + m


def _bits32(qh: torch.Tensor) -> torch.Tensor:
    """(n, 4) bytes of a little-endian uint32 -> (n, 32) bits, bit j at column j."""
    n = qh.shape[0]
    return ((qh.reshape(n, 4, 1) >> _shifts(list(range(8)), (1, 1, 8), qh.device)) & 1).reshape(n, 32)


def _dq_q5_0(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _half(b[:, 0:2])
    qh = _bits32(b[:, 2:6])
    ql = _nibbles(b[:, 6:], 16).reshape(n, 32)
    q = (ql | (qh << 4)).to(torch.int8) - 16
    return d * q.to(torch.float32)


def _dq_q5_1(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _half(b[:, 0:2])
    m = _half(b[:, 2:4])
    qh = _bits32(b[:, 4:8])
    ql = _nibbles(b[:, 8:], 16).reshape(n, 32)
    q = (ql | (qh << 4)).to(torch.float32)
    return (d * q) + m


def _dq_q8_0(b: torch.Tensor) -> torch.Tensor:
    d = _half(b[:, 0:2])
    x = b[:, 2:].contiguous().view(torch.int8).to(torch.float32)
    return x * d


def _dq_q2_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales = b[:, 0:16]
    qs = b[:, 16:80]
    d = _half(b[:, 80:82])
    dmin = _half(b[:, 82:84])
    dl = (d * (scales & 0x0F).to(torch.float32)).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).to(torch.float32)).reshape(n, 16, 1)
    q = (qs.reshape(n, -1, 1, 32) >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), b.device)) & 3
    q = q.reshape(n, 16, 16).to(torch.float32)
    return (dl * q - ml).reshape(n, QK_K)


def _dq_q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    hmask = b[:, 0:32]
    qs = b[:, 32:96]
    scales = b[:, 96:108]
    d = _half(b[:, 108:110])
    lsc = (scales[:, :8].reshape(n, 1, 8) >> _shifts([0, 4], (1, 2, 1), b.device)).reshape(n, 16)
    hsc = (scales[:, 8:].reshape(n, 1, 4) >> _shifts([0, 2, 4, 6], (1, 4, 1), b.device)).reshape(n, 16)
    sc = (lsc & 0x0F) | ((hsc & 0x03) << 4)
    sc = (sc.to(torch.int8) - 32).to(torch.float32)
    dl = (d * sc).reshape(n, 16, 1)
    ql = (qs.reshape(n, -1, 1, 32) >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), b.device)).reshape(n, 16, 16) & 3
    qh = (hmask.reshape(n, -1, 1, 32) >> _shifts(list(range(8)), (1, 1, 8, 1), b.device)).reshape(n, 16, 16) & 1
    qh = qh ^ 1  # the high bit subtracts 4 when it is *clear*
    q = (ql.to(torch.int8) - (qh << 2).to(torch.int8)).to(torch.float32)
    return (dl * q).reshape(n, QK_K)


def _scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit scales and mins packed in 12 bytes (Q4_K / Q5_K)."""
    n = scales.shape[0]
    s = scales.reshape(n, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _dq_q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _half(b[:, 0:2])
    dmin = _half(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    dd = (d * sc.to(torch.float32)).reshape(n, -1, 1)
    dm = (dmin * mn.to(torch.float32)).reshape(n, -1, 1)
    q = _nibbles(b[:, 16:], 32).reshape(n, -1, 32).to(torch.float32)
    return (dd * q - dm).reshape(n, QK_K)


def _dq_q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _half(b[:, 0:2])
    dmin = _half(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    qh = b[:, 16:48]
    qs = b[:, 48:]
    dd = (d * sc.to(torch.float32)).reshape(n, -1, 1)
    dm = (dmin * mn.to(torch.float32)).reshape(n, -1, 1)
    ql = _nibbles(qs, 32).reshape(n, -1, 32)
    h = ((qh.reshape(n, -1, 1, 32) >> _shifts(list(range(8)), (1, 1, 8, 1), b.device)) & 1).reshape(n, -1, 32)
    q = (ql | (h << 4)).to(torch.float32)
    return (dd * q - dm).reshape(n, QK_K)


def _dq_q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql = b[:, 0:128]
    qh = b[:, 128:192]
    scales = b[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
    d = _half(b[:, 208:210])
    dd = (d * scales).reshape(n, 16, 1)
    lo = _nibbles(ql, 64).reshape(n, -1, 32)
    hi = ((qh.reshape(n, -1, 1, 32) >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), b.device)) & 3).reshape(n, -1, 32)
    q = (lo | (hi << 4)).to(torch.int8) - 32
    q = q.reshape(n, 16, -1).to(torch.float32)
    return (dd * q).reshape(n, QK_K)


_DEQUANT: dict[QuantizationEncoding, Callable[[torch.Tensor], torch.Tensor]] = {
    QuantizationEncoding.Q4_0: _dq_q4_0,
    QuantizationEncoding.Q4_1: _dq_q4_1,
    QuantizationEncoding.Q5_0: _dq_q5_0,
    QuantizationEncoding.Q5_1: _dq_q5_1,
    QuantizationEncoding.Q8_0: _dq_q8_0,
    QuantizationEncoding.Q2_K: _dq_q2_k,
    QuantizationEncoding.Q3_K: _dq_q3_k,
    QuantizationEncoding.Q4_K: _dq_q4_k,
    QuantizationEncoding.Q5_K: _dq_q5_k,
    QuantizationEncoding.Q6_K: _dq_q6_k,
}


def dequantize_blocks(blocks: torch.Tensor, encoding: Any) -> torch.Tensor:
    """``(n_blocks, block_size)`` uint8 -> ``(n_blocks, elements_per_block)`` float32."""
    enc = _enc(encoding)
    if isinstance(enc, str) or enc not in _DEQUANT:
        raise ValueError(f"dequantize_blocks: {encoding!r} is not a GGML block encoding")
    b = _as_u8(blocks)
    if b.ndim != 2 or b.shape[1] != enc.block_size:
        raise ValueError(f"dequantize_blocks: {enc._name_} blocks must have shape (n, {enc.block_size}), got {tuple(b.shape)}")
    return _DEQUANT[enc](b)


def dequantize(blocks: Any, encoding: Any, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode a raw block tensor into float32.

    ``blocks``: uint8 (torch, numpy or DLPack) of shape ``(*rows, bytes_per_row)``.
    ``encoding``: a :class:`QuantizationEncoding` (GGML kinds), its name, a
    ``gguf.GGMLQuantizationType``, or ``"F32"``/``"F16"``/``"BF16"`` (the
    bytes are reinterpreted and widened to float32).
    Returns float32 of shape ``(*rows, bytes_per_row // block_size * elements_per_block)``.
    """
    enc = _enc(encoding)
    b = _as_u8(blocks)
    if b.ndim == 0:
        raise ValueError("dequantize: blocks must have at least one dimension")
    lead = tuple(b.shape[:-1])
    row_bytes = int(b.shape[-1])
    if isinstance(enc, str):
        item = torch.empty((), dtype=FLOAT_KINDS[enc]).element_size()
        if row_bytes % item:
            raise ValueError(f"dequantize: {enc} rows of {row_bytes} bytes are not a whole number of {item}-byte values")
        flat = b.reshape(-1, row_bytes).contiguous().view(FLOAT_KINDS[enc])
        res = flat.to(torch.float32) if enc != "F32" else flat.clone()
        if enc == "F16":
            res = _keep_f16_nan_payloads(flat, res)
        res = res.reshape(*lead, row_bytes // item)
        if out is not None:
            out.copy_(res)
            return out
        return res
    if enc not in _DEQUANT:
        raise ValueError(f"dequantize: {enc} is not a GGML block encoding (GPTQ weights use their own scales)")
    bs, epb = enc.block_size, enc.elements_per_block
    if row_bytes % bs:
        raise ValueError(
            f"dequantize: {enc._name_} rows must be a multiple of {bs} bytes (one block), got {row_bytes} bytes per row"
        )
    flat = b.reshape(-1, bs)
    nblk = flat.shape[0]
    if out is None:
        out = torch.empty((*lead, row_bytes // bs * epb), dtype=torch.float32, device=b.device)
    dst = out.view(nblk, epb)
    fn = _DEQUANT[enc]
    for s in range(0, nblk, _CHUNK_BLOCKS):
        dst[s:s + _CHUNK_BLOCKS] = fn(flat[s:s + _CHUNK_BLOCKS])
    return out


def _keep_f16_nan_payloads(h: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Widen float16 NaNs bit-exactly (sign, all-ones exponent, payload << 13), as numpy does.

    torch's conversion quiets signalling NaNs; numpy (and so gguf) keeps the payload.
    """
    nan = torch.isnan(h)
    if not bool(nan.any()):
        return f
    bits = h.view(torch.int16).to(torch.int32)
    exact = ((bits & 0x8000) << 16) | 0x7F800000 | ((bits & 0x03FF) << 13)
    return torch.where(nan, exact.view(torch.float32), f)


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
