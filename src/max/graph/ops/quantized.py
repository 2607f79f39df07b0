"""Quantised ops: ``dequantize`` and ``qmatmul`` over GGML block-quantised weights.

A quantised weight is a uint8 tensor of shape ``[rows, bytes_per_row]`` whose
rows are whole blocks of its :class:`~max.graph.quantization.QuantizationEncoding`.
Besides the reference's Q4_0/Q4_K/Q6_K, every GGML kind that
``max.graph.quantization`` lists works (Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q5_K).

``qmatmul(GPTQ, config, x, w)``: ``w`` holds symmetric 4-bit GPTQ rows (codes, then float16 scales; see
``max.graph.quantization.gptq``); the graph reads them as the Q4_0 blocks they equal (a
``gptq_to_q4_0`` node, folded once at load for a constant weight) and multiplies those.
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
        fail(op, "GPTQ weights are decoded with their quantization_config (group size): use qmatmul(GPTQ, config, "
                 "...), or dequantize the checkpoint's groups to float", ValueError)
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
        fail(op, f"takes one quantised rhs tensor (GPTQ rows hold their scales), got {len(rhs)}")
    if encoding is QuantizationEncoding.GPTQ:
        encoding, w0 = QuantizationEncoding.Q4_0, _gptq_as_q4_0(op, config, rhs[0])
        rhs = (w0,)
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


def _gptq_as_q4_0(op: str, config: Any, w: Any) -> TensorValue:
    """GPTQ rows ``[N, bytes]`` -> a ``gptq_to_q4_0`` node giving the equal Q4_0 blocks ``[N, K / 32 * 18]``.
    The rows hold no zero points: every zero is 8 (asymmetric GPTQ checkpoints load through the pipeline,
    as Q4_1 blocks)."""
    from max.graph.quantization.gptq import gptq_row_inputs

    if not isinstance(config, QuantizationConfig):
        fail(op, f"GPTQ needs a QuantizationConfig (bits, group_size), got {config!r}", TypeError)
    if config.bits != 4:
        fail(op, f"GPTQ with {config.bits}-bit weights is not supported (4-bit only)")
    g = int(config.group_size)
    if g != -1 and (g <= 0 or g % 32):
        fail(op, f"GPTQ group_size {g} is not supported (a multiple of 32, or -1)")
    t = as_tensor(w, op=op, arg="rhs")
    if t.dtype is not DType.uint8 or t.rank != 2:
        fail(op, f"GPTQ rhs must be uint8 [N, bytes_per_row], got {t.type}", TypeError)
    nbytes = t.shape[1]
    if not hasattr(nbytes, "dim"):
        fail(op, f"GPTQ rhs rows must have a static byte count, got {nbytes}")
    k = gptq_row_inputs(int(nbytes.dim), g)
    if k is None:
        fail(op, f"GPTQ rhs rows of {nbytes.dim} bytes are not K / 2 code bytes + 2 * K / {g} scale bytes "
                 "for any K that is a multiple of 32 and of the group size")
    return stage1("gptq_to_q4_0", [t], TensorType(DType.uint8, [t.shape[0], k // 32 * 18], t.device),
                  {"k": k, "group_size": g})
