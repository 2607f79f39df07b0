"""Quantised ops: ``dequantize`` and ``qmatmul`` over GGML block-quantised weights.

A quantised weight is a uint8 tensor of shape ``[rows, bytes_per_row]`` whose
rows are whole blocks of its :class:`~max.graph.quantization.QuantizationEncoding`.
Besides the reference's Q4_0/Q4_K/Q6_K, every GGML kind that
``max.graph.quantization`` lists works (Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q5_K).
"""

from __future__ import annotations

from typing import Any

from max.dtype import DType
from max.graph.ops._common import as_tensor, fail, same_device, stage1
from max.graph.quantization import QuantizationConfig, QuantizationEncoding
from max.graph.type import TensorType
from max.graph.value import TensorValue

__all__ = ["dequantize", "qmatmul"]


def _blocks(op: str, encoding: Any, q: Any, arg: str) -> tuple[QuantizationEncoding, TensorValue, Any]:
    if not isinstance(encoding, QuantizationEncoding):
        fail(op, f"encoding must be a QuantizationEncoding, got {encoding!r}", TypeError)
    if encoding is QuantizationEncoding.GPTQ:
        raise NotImplementedError(f"{op}: GPTQ weights are not supported yet (GGML block encodings are)")
    t = as_tensor(q, op=op, arg=arg)
    if t.dtype is not DType.uint8:
        fail(op, f"{arg} must hold the raw {encoding.name} blocks as uint8, got {t.dtype}", TypeError)
    if t.rank != 2:
        fail(op, f"{arg} must be rank 2 ([rows, bytes_per_row]), got {t.shape}")
    nbytes = t.shape[1]
    bs = encoding.block_size
    if hasattr(nbytes, "dim") and nbytes.dim % bs:
        fail(op, f"{arg} rows have {nbytes.dim} bytes, not a whole number of {encoding.name} blocks "
                 f"({bs} bytes each)")
    k = (nbytes // bs) * encoding.elements_per_block
    return encoding, t, k


def dequantize(encoding: QuantizationEncoding, quantized: Any) -> TensorValue:
    """Decode ``[rows, bytes]`` uint8 blocks to float32 ``[rows, elements]``."""
    op = "dequantize"
    enc, q, k = _blocks(op, encoding, quantized, "quantized")
    return stage1(op, [q], TensorType(DType.float32, [q.shape[0], k], q.device), {"encoding": enc.name})


def qmatmul(encoding: QuantizationEncoding, config: QuantizationConfig | None, lhs: Any, *rhs: Any) -> TensorValue:
    """``lhs @ dequantize(rhs).T``: ``rhs`` is the quantised weight, pre-transposed (``[N, K_bytes]``).

    Leading dims of ``lhs`` broadcast; the result is ``[..., N]`` in ``lhs``'s dtype.
    """
    op = "qmatmul"
    if not rhs:
        fail(op, "needs the quantised right-hand side")
    if len(rhs) > 1:
        raise NotImplementedError(f"{op}: auxiliary rhs tensors (GPTQ) are not supported yet")
    enc, w, k = _blocks(op, encoding, rhs[0], "rhs")
    x = as_tensor(lhs, op=op, arg="lhs")
    if not x.dtype.is_float():
        fail(op, f"lhs must be floating point, got {x.dtype}", TypeError)
    if x.rank < 1:
        fail(op, f"lhs must have rank >= 1, got {x.shape}")
    if x.shape[-1] != k:
        fail(op, f"lhs {x.shape} and the {enc.name} rhs ({w.shape[0]} x {k} after dequantizing): "
                 f"inner dimensions {x.shape[-1]} and {k} differ")
    dev = same_device(op, x, w)
    return stage1(op, [x, w], TensorType(x.dtype, list(x.shape[:-1]) + [w.shape[0]], dev), {"encoding": enc.name})
