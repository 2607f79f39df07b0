"""The reference quantise / dequantise of every block format, in plain torch.

``dequantize(blocks, encoding)`` turns a raw ``uint8`` block tensor of shape
``(*rows, bytes_per_row)`` into float32 values of shape
``(*rows, bytes_per_row // block_size * elements_per_block)``.  Every format
is decoded with whole-tensor operations (no Python loop over blocks; large
tensors are processed in chunks of blocks to bound temporaries) and performs
the same float32 operations in the same order as ggml's reference decoder
(and the ``gguf`` package), so the results are bit-identical to it.

``quantize(x, kind)`` encodes float rows into the block kinds that
``formats`` marks ``quantize_on_load`` (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0),
bit-identical to ggml's reference quantiser.

Faster versions plug in with :func:`register_quantizer`: the native engine
registers its C quantiser when it loads; a registered function may return
``None`` to decline (no native library), and the reference runs.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import torch

from max.graph.quantization.encoding import QuantizationEncoding
from max.graph.quantization.formats import by_name

__all__ = ["FLOAT_KINDS", "dequantize", "dequantize_blocks", "quantize", "quantize_reference",
           "register_quantizer"]

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


# ------------------------------------------------------------------ quantise (float -> blocks)
def _f16_bytes(v: torch.Tensor) -> torch.Tensor:
    """(n, 1) float32 -> (n, 2) uint8: the float16 bytes."""
    return v.to(torch.float16).view(torch.uint8).reshape(v.shape[0], 2)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.zeros_like(d), 1.0 / d)


def _signed_absmax(x: torch.Tensor) -> torch.Tensor:
    """The value of largest magnitude of each block, with its sign (the first such value)."""
    return torch.gather(x, 1, x.abs().argmax(dim=1, keepdim=True))


def _trunc_codes(v: torch.Tensor, top: int) -> torch.Tensor:
    return torch.trunc(v).clamp(0, top).to(torch.uint8)


def _pair_nibbles(q: torch.Tensor) -> torch.Tensor:
    """(n, 32) codes -> (n, 16) bytes: code j in the low nibble, code j + 16 in the high one."""
    return (q[:, :16] & 0x0F) | (q[:, 16:] << 4)


def _high_bits(q: torch.Tensor) -> torch.Tensor:
    """(n, 32) 5-bit codes -> (n, 4) bytes holding bit 4 of code j at bit j (little-endian)."""
    bits = (q >> 4).to(torch.int64) & 1
    word = (bits << torch.arange(32, dtype=torch.int64)).sum(dim=1, keepdim=True)
    return ((word >> torch.tensor([0, 8, 16, 24], dtype=torch.int64)) & 0xFF).to(torch.uint8)


def _q_q4_0(x: torch.Tensor) -> torch.Tensor:
    d = _signed_absmax(x) / -8.0
    q = _trunc_codes(x * _inverse(d) + 8.5, 15)
    return torch.cat([_f16_bytes(d), _pair_nibbles(q)], dim=1)


def _q_q4_1(x: torch.Tensor) -> torch.Tensor:
    lo, hi = x.min(dim=1, keepdim=True).values, x.max(dim=1, keepdim=True).values
    d = (hi - lo) / 15.0
    q = _trunc_codes((x - lo) * _inverse(d) + 0.5, 15)
    return torch.cat([_f16_bytes(d), _f16_bytes(lo), _pair_nibbles(q)], dim=1)


def _q_q5_0(x: torch.Tensor) -> torch.Tensor:
    d = _signed_absmax(x) / -16.0
    q = _trunc_codes(x * _inverse(d) + 16.5, 31)
    return torch.cat([_f16_bytes(d), _high_bits(q), _pair_nibbles(q)], dim=1)


def _q_q5_1(x: torch.Tensor) -> torch.Tensor:
    lo, hi = x.min(dim=1, keepdim=True).values, x.max(dim=1, keepdim=True).values
    d = (hi - lo) / 31.0
    q = _trunc_codes((x - lo) * _inverse(d) + 0.5, 31)
    return torch.cat([_f16_bytes(d), _f16_bytes(lo), _high_bits(q), _pair_nibbles(q)], dim=1)


def _q_q8_0(x: torch.Tensor) -> torch.Tensor:
    d = x.abs().max(dim=1, keepdim=True).values / 127.0
    v = x * _inverse(d)
    q = (torch.sign(v) * torch.floor(v.abs() + 0.5)).to(torch.int8)  # roundf: halves away from zero
    return torch.cat([_f16_bytes(d), q.view(torch.uint8)], dim=1)


_QUANT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Q4_0": _q_q4_0, "Q4_1": _q_q4_1, "Q5_0": _q_q5_0, "Q5_1": _q_q5_1, "Q8_0": _q_q8_0,
}
_FAST_QUANT: list[Callable[[torch.Tensor, str], Optional[torch.Tensor]]] = []


def register_quantizer(fn: Callable[[torch.Tensor, str], Optional[torch.Tensor]]) -> None:
    """Register a faster ``fn(x [N, K] float32, kind) -> blocks or None`` (None: declined)."""
    if fn not in _FAST_QUANT:
        _FAST_QUANT.append(fn)


def _check_quantizable(x: torch.Tensor, kind: str) -> tuple[str, int]:
    try:
        fmt = by_name(kind)
    except KeyError as e:
        raise ValueError(f"quantize: {e.args[0]}") from None
    if not fmt.quantize_on_load or fmt.name not in _QUANT:
        from max.graph.quantization.formats import quantizable_on_load

        raise ValueError(f"quantize: float weights cannot be quantised to {fmt.user_name} "
                         f"(supported: {', '.join(f.user_name or f.name for f in quantizable_on_load())})")
    if x.ndim != 2 or x.shape[1] % fmt.elements_per_block:
        raise ValueError(f"quantize: expected a 2-D weight whose rows are a multiple of {fmt.elements_per_block} "
                         f"values, got shape {tuple(x.shape)}")
    return fmt.name, fmt.block_size


def quantize_reference(x: Any, kind: str) -> torch.Tensor:
    """float ``x [N, K]`` -> GGML blocks ``[N, K / 32 * block_bytes]`` (uint8), in torch."""
    x = torch.as_tensor(x).detach().to(torch.float32)
    name, bs = _check_quantizable(x, kind)
    n, k = x.shape
    out = torch.empty((n, k // 32 * bs), dtype=torch.uint8)
    flat_in = x.reshape(-1, 32)
    flat_out = out.view(-1, bs)
    for s in range(0, flat_in.shape[0], _CHUNK_BLOCKS):
        flat_out[s:s + _CHUNK_BLOCKS] = _QUANT[name](flat_in[s:s + _CHUNK_BLOCKS])
    return out


def quantize(x: Any, kind: str) -> torch.Tensor:
    """float ``x [N, K]`` -> GGML blocks of ``kind`` (``"Q4_0"``/``"q4_0"``, ...), bit-identical to
    ggml's reference quantiser; a registered native quantiser runs when it accepts the call."""
    x = torch.as_tensor(x).detach().to(torch.float32)
    name, _ = _check_quantizable(x, kind)
    for fn in _FAST_QUANT:
        res = fn(x, name)
        if res is not None:
            return res
    return quantize_reference(x, name)
