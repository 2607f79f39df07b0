"""The float8 entry points of ``max.nn.kernels``: quantisation to float8 (static and dynamic scales),
scaled float8 matmuls, the fused QKV projection of float8 weights, and the E4M3FN -> E4M3FNUZ
conversion AMD CDNA3 GPUs need.

Float8 values are real float8 tensors (torch ``float8_e4m3fn`` / ``float8_e4m3fnuz`` storage on
every device, CPU included); quantisation saturates to the format's largest finite value
(448 for E4M3FN, 240 for E4M3FNUZ) and rounds to nearest even.  Scales multiply: a float8 value
``q`` with scale ``s`` stands for ``q * s``.

Each function is a type rule staging one node (kernels: ``max.engine.kernels.float8``) or a
composition of existing ops.
"""

from __future__ import annotations

from typing import Any

from max.dtype import DType
from max.graph import TensorType, TensorValue, ops
from max.graph.ops._common import as_tensor, fail, stage, stage1

__all__ = ["convert_weights_to_fp8_fnuz_if_needed", "dynamic_scaled_matmul", "fused_qkv_ragged_matmul_scaled_float8",
           "matmul_static_scaled_float8", "needs_fp8_fnuz_conversion", "normalize_e4m3fn_to_e4m3fnuz",
           "quantize_dynamic_scaled_float8", "quantize_static_scaled_float8"]

_FP8_OUT = (DType.float8_e4m3fn, DType.float8_e4m3fnuz)


def _fp8_out(op: str, out_type: DType) -> DType:
    if out_type not in _FP8_OUT:
        fail(op, f"out_type must be float8_e4m3fn or float8_e4m3fnuz, got {out_type}", TypeError)
    return out_type


def _scale_operand(op: str, s: Any, name: str, device: Any) -> TensorValue:
    if isinstance(s, (int, float)):
        return ops.constant(float(s), DType.float32, device)
    t = as_tensor(s, op=op, arg=name)
    if not t.dtype.is_float():
        fail(op, f"{name} must be a floating-point tensor, got {t.dtype}", TypeError)
    return t


def quantize_static_scaled_float8(x: Any, scale: Any, scale_is_inverted: bool = True,
                                  out_type: DType = DType.float8_e4m3fn) -> TensorValue:
    """``x * scale`` (``scale_is_inverted``) or ``x / scale``, saturated and rounded to ``out_type``.

    ``scale`` is one value (a scalar, or a tensor of one element)."""
    op = "quantize_static_scaled_float8"
    xv = as_tensor(x, op=op, arg="x")
    if not xv.dtype.is_float() or xv.dtype.is_float8():
        fail(op, f"x must be a float16/bfloat16/float32 tensor, got {xv.dtype}", TypeError)
    sv = _scale_operand(op, scale, "scale", xv.device)
    if any(int(d) != 1 for d in sv.shape):
        fail(op, f"scale must hold one value, got shape {sv.shape}")
    out = _fp8_out(op, out_type)
    return stage1(op, [xv, sv.reshape([])], TensorType(out, xv.shape, xv.device),
                  {"inverted": bool(scale_is_inverted), "out_dtype": out})


def _group_size(op: str, spec: Any, group_size_or_per_token: int) -> int:
    g = int(group_size_or_per_token)
    spec_block = getattr(spec, "block_size", None)
    if g == -1 and spec_block:  # a block spec's column size
        g = int(spec_block[1]) if isinstance(spec_block, (tuple, list)) else int(spec_block)
    return g


def quantize_dynamic_scaled_float8(input: Any, input_scale_spec: Any = None, weight_scale_spec: Any = None,
                                   scale_ub: float = 1200.0, group_size_or_per_token: int = -1,
                                   out_type: DType = DType.float8_e4m3fn,
                                   scales_type: DType = DType.bfloat16) -> tuple[TensorValue, TensorValue]:
    """Quantise ``input`` ``[M, K]`` with scales computed from the data: ``(q [M, K], scales [M, K // g])``.

    Each row (``group_size_or_per_token=-1``: per token) or each group of ``g`` columns of a row gets
    ``scale = min(max |x|, scale_ub) / fp8_max`` (stored as ``scales_type``) and ``q = x / scale``
    saturated to ``out_type``; an all-zero group has scale 0 and quantises to zeros."""
    op = "quantize_dynamic_scaled_float8"
    xv = as_tensor(input, op=op, arg="input")
    if xv.rank != 2 or not xv.dtype.is_float() or xv.dtype.is_float8():
        fail(op, f"input must be a [M, K] float16/bfloat16/float32 tensor, got {xv.type}")
    out = _fp8_out(op, out_type)
    if not scales_type.is_float() or scales_type.is_float8():
        fail(op, f"scales_type must be float16, bfloat16 or float32, got {scales_type}", TypeError)
    if scale_ub <= 0:
        fail(op, f"scale_ub must be > 0, got {scale_ub}")
    K = xv.shape[1]
    g = _group_size(op, input_scale_spec, group_size_or_per_token)
    if g == -1:
        n_groups: Any = 1
        g_attr = -1
    else:
        if g <= 0 or not hasattr(K, "dim") or int(K) % g:
            fail(op, f"group size {g} must be positive and divide the static K = {K}")
        n_groups, g_attr = int(K) // g, g
    q, s = stage(op, [xv], [TensorType(out, xv.shape, xv.device),
                           TensorType(scales_type, [xv.shape[0], n_groups], xv.device)],
                 {"group": g_attr, "scale_ub": float(scale_ub), "q_dtype": out, "s_dtype": scales_type,
                  "_multi": True})
    return q, s


def _fp8_operand(op: str, v: Any, name: str) -> TensorValue:
    t = as_tensor(v, op=op, arg=name)
    if t.rank != 2 or not t.dtype.is_float8():
        fail(op, f"{name} must be a rank-2 float8 tensor, got {t.type}", TypeError)
    return t


def matmul_static_scaled_float8(input: Any, weight: Any, input_scale: Any, weight_scale: Any,
                                out_type: DType = DType.bfloat16) -> TensorValue:
    """``(input * input_scale) @ (weight * weight_scale).T`` for float8 ``input`` ``[M, K]`` and
    ``weight`` ``[N, K]``; ``input_scale`` one value, ``weight_scale`` one value or ``[N]``/``[N, 1]``
    (per output channel).  Accumulates in float32; the result is ``out_type`` (bfloat16)."""
    op = "matmul_static_scaled_float8"
    a, b = _fp8_operand(op, input, "input"), _fp8_operand(op, weight, "weight")
    if a.shape[1] != b.shape[1]:
        fail(op, f"input [M, K] and weight [N, K] must share K, got {a.shape} and {b.shape}")
    sa = _scale_operand(op, input_scale, "input_scale", a.device)
    sb = _scale_operand(op, weight_scale, "weight_scale", b.device)
    if any(int(d) != 1 for d in sa.shape):
        fail(op, f"input_scale must hold one value, got shape {sa.shape}")
    n_sb = 1
    for d in sb.shape:
        n_sb *= int(d)
    if n_sb not in (1, int(b.shape[0])):
        fail(op, f"weight_scale must hold one value or one per output row ({b.shape[0]}), got {sb.shape}")
    return stage1(op, [a, b, sa.reshape([1, 1]), sb.reshape([1, -1])],
                  TensorType(out_type, [a.shape[0], b.shape[0]], a.device), {"out_dtype": out_type})


def dynamic_scaled_matmul(a: Any, b: Any, a_scales: Any, b_scales: Any, input_scale_spec: Any = None,
                          weight_scale_spec: Any = None, out_type: DType = DType.bfloat16) -> TensorValue:
    """``(a * a_scales) @ (b * b_scales).T``: float8 ``a`` ``[M, K]`` with per-token scales ``[M, 1]``
    (or ``[1, M]``), float8 ``b`` ``[N, K]`` (transposed) with channel-wise scales ``[N, 1]`` (or
    ``[1, N]``).  Accumulates in float32; the result is ``out_type``."""
    op = "dynamic_scaled_matmul"
    av, bv = _fp8_operand(op, a, "a"), _fp8_operand(op, b, "b")
    if av.shape[1] != bv.shape[1]:
        fail(op, f"a [M, K] and b [N, K] must share K, got {av.shape} and {bv.shape}")
    sa, sb = as_tensor(a_scales, op=op, arg="a_scales"), as_tensor(b_scales, op=op, arg="b_scales")
    for s, rows, name in ((sa, av.shape[0], "a_scales"), (sb, bv.shape[0], "b_scales")):
        if s.rank != 2 or not ((s.shape[0] == rows and int(s.shape[1]) == 1)
                               or (int(s.shape[0]) == 1 and s.shape[1] == rows)):
            fail(op, f"{name} must be [{rows}, 1] or [1, {rows}] (per-token / channel-wise), got {s.shape}")
        if not s.dtype.is_float() or s.dtype.is_float8():
            fail(op, f"{name} must be float16/bfloat16/float32, got {s.dtype}", TypeError)
    return stage1(op, [av, bv, sa.reshape([-1, 1]), sb.reshape([1, -1])],
                  TensorType(out_type, [av.shape[0], bv.shape[0]], av.device), {"out_dtype": out_type})


def fused_qkv_ragged_matmul_scaled_float8(kv_params: Any, input: Any, input_row_offsets: Any, wqkv: Any,
                                          kv_collection: Any, layer_idx: Any, n_heads: int, input_scale: Any,
                                          weight_scale: Any, bias: Any = None) -> TensorValue:
    """Float8 QKV projection of a ragged batch: ``(input * input_scale) @ (wqkv * weight_scale).T``
    (+ bias); returns Q ``[total_seq_len, n_heads * head_dim]`` and writes K and V to the cache.

    ``input`` float8 ``[total_seq_len, hidden]``, ``wqkv`` float8 ``[(n_heads + 2 n_kv_heads) * head_dim,
    hidden]``; the scales as in :func:`matmul_static_scaled_float8`.  ValueError on other shapes."""
    from max.nn.kernels import ragged_qkv_store

    op = "fused_qkv_ragged_matmul_scaled_float8"
    x, w = _fp8_operand(op, input, "input"), _fp8_operand(op, wqkv, "wqkv")
    D, Hkv = kv_params.head_dim, kv_params.n_kv_heads_per_device
    want = (n_heads + 2 * Hkv) * D
    if int(w.shape[0]) != want or w.shape[1] != x.shape[1]:
        fail(op, f"wqkv must be [(n_heads + 2 * n_kv_heads) * head_dim, hidden] = [{want}, {x.shape[1]}], "
                 f"got {w.shape}")
    qkv = matmul_static_scaled_float8(x, w, input_scale, weight_scale, out_type=kv_params.dtype
                                      if kv_params.dtype.is_float() and not kv_params.dtype.is_float8()
                                      else DType.bfloat16)
    if bias is not None:
        b = as_tensor(bias, op=op, arg="bias")
        if [int(d) for d in b.shape] != [want]:
            fail(op, f"bias must be [{want}], got {b.shape}")
        qkv = qkv + b.cast(qkv.dtype)
    q = ragged_qkv_store(kv_params, qkv, input_row_offsets, kv_collection, layer_idx, n_heads)
    return ops.reshape(q, [-1, n_heads * D])


def needs_fp8_fnuz_conversion() -> bool:
    """True when the accelerator is an AMD CDNA3 GPU (``gfx94x``), whose float8 is E4M3FNUZ."""
    from max.driver import accelerator_api, accelerator_architecture_name

    if accelerator_api() != "hip":
        return False
    try:
        return accelerator_architecture_name().startswith("gfx94")
    except Exception:
        return False


def normalize_e4m3fn_to_e4m3fnuz(weight: Any, weight_scale: Any) -> tuple[TensorValue, TensorValue]:
    """The same values in E4M3FNUZ: ``(weight', 2 * weight_scale)``.

    The bits are kept (a FNUZ value is half the FN value of the same bits, so the scale doubles)
    except ``0x80``: -0 in E4M3FN but NaN in E4M3FNUZ, it becomes ``0x00``."""
    op = "normalize_e4m3fn_to_e4m3fnuz"
    w = as_tensor(weight, op=op, arg="weight")
    if w.dtype is not DType.float8_e4m3fn:
        fail(op, f"weight must be float8_e4m3fn, got {w.dtype}", TypeError)
    s = _scale_operand(op, weight_scale, "weight_scale", w.device)
    return stage1(op, [w], TensorType(DType.float8_e4m3fnuz, w.shape, w.device), {}), s * 2.0


def convert_weights_to_fp8_fnuz_if_needed(weight: Any, weight_scale: Any) -> tuple[Any, Any]:
    """``normalize_e4m3fn_to_e4m3fnuz(weight, weight_scale)`` on AMD CDNA3 GPUs (and only for E4M3FN
    weights); the inputs unchanged everywhere else."""
    w = weight if isinstance(weight, TensorValue) else None
    if needs_fp8_fnuz_conversion() and w is not None and w.dtype is DType.float8_e4m3fn:
        return normalize_e4m3fn_to_e4m3fnuz(weight, weight_scale)
    return weight, weight_scale


def matmul_float8_weight(x: Any, weight: Any, weight_scale: Any, block_size: tuple[int, int] | None = None
                         ) -> TensorValue:
    """``x @ (weight * scale).T`` for a float8 ``weight`` ``[N, K]`` and activations ``x`` ``[..., K]`` in
    their own float dtype (libremax extension: the weight-only FP8 projection of FP8 checkpoints).

    ``weight_scale``: one value (per tensor), or ``[ceil(N / bo), ceil(K / bi)]`` block scales with
    ``block_size = (bo, bi)``.  The weight is widened per call inside the kernel, so only the float8
    bytes stay in memory (a graph of ``cast``/``mul`` on the weight would be folded into a float copy
    at load)."""
    op = "matmul_float8_weight"
    xv = as_tensor(x, op=op, arg="x")
    w = as_tensor(weight, op=op, arg="weight")
    s = _scale_operand(op, weight_scale, "weight_scale", w.device)
    if w.rank != 2 or not w.dtype.is_float8():
        fail(op, f"weight must be a rank-2 float8 tensor, got {w.type}", TypeError)
    if xv.rank < 1 or not xv.dtype.is_float() or xv.dtype.is_float8() or xv.shape[-1] != w.shape[1]:
        fail(op, f"x must be a float [..., {w.shape[1]}] tensor, got {xv.type}")
    N, K = int(w.shape[0]), int(w.shape[1])
    if block_size is None:
        if any(int(d) != 1 for d in s.shape):
            fail(op, f"a per-tensor weight_scale holds one value, got shape {s.shape}")
        s, blk = s.reshape([1, 1]), (N, K)
    else:
        bo, bi = (int(b) for b in block_size)
        want = [-(-N // bo), -(-K // bi)]
        if [int(d) for d in s.shape] != want:
            fail(op, f"block scales for a [{N}, {K}] weight in {bo}x{bi} blocks must be {want}, got {s.shape}")
        blk = (bo, bi)
    return stage1(op, [xv, w, s.cast(DType.float32)], TensorType(xv.dtype, list(xv.shape[:-1]) + [w.shape[0]],
                                                               xv.device), {"block": blk})
