"""``max.nn.kernels`` entry points for attention without a KV cache, cross attention over the cache,
K/V projections into the cache, and the quantised QKV projections.

- :func:`flash_attention_gpu` (padded ``[batch, seq, heads, head_dim]``) and
  :func:`flash_attention_ragged_gpu` (ragged ``[total_seq_len, heads, head_dim]``): attention of
  q/k/v tensors, no cache.  Despite the names they run on every device, CPU included.
- :func:`cross_attention_ragged`: this step's queries attend to the first ``kv_len`` cached
  positions of their request (``kv_input_row_offsets`` holds the ``kv_len`` prefix sums), e.g. the
  image tokens of a vision-language decoder or a speech encoder's frames.
- :func:`matmul_k_cache_ragged`, :func:`matmul_kv_cache_ragged`: project hidden states to K (and V)
  and write them to the cache slots of this step's tokens; :func:`kv_cache_ragged_radd` adds a
  tensor into those slots for the requests from ``batch_offset`` on.
- :func:`fused_qkv_ragged_matmul_quantized` (GPTQ) and :func:`unfused_qkv_ragged_matmul_gguf_quantized`
  (GGML block encodings): quantised projections composed with ``ops.qmatmul`` and the cache write.

Type rules here; kernels in ``max.engine.kernels.attention`` (cache writes: ``max.engine.kernels.decoder``).
"""

from __future__ import annotations

from typing import Any

from max.dtype import DType
from max.graph import TensorValue, ops
from max.graph.ops._common import as_tensor, fail, stage1
from max.graph.quantization import QuantizationEncoding
from max.nn.kernels import MHAMaskVariant, _chained, _coll, _layer, _offsets, _plan
from max.nn.kernels_decoder import store_kv_ragged
from max.nn.kv_cache.cache_params import KVCacheParams

__all__ = ["cross_attention_ragged", "flash_attention_gpu", "flash_attention_ragged_gpu",
           "fused_qkv_ragged_matmul_quantized", "kv_cache_ragged_radd", "matmul_k_cache_ragged", "matmul_kv_cache_ragged",
           "unfused_qkv_ragged_matmul_gguf_quantized"]


def _mask(op: str, mask_variant: Any, local_window_size: int) -> tuple[bool, int]:
    mv = MHAMaskVariant(mask_variant)
    if mv is MHAMaskVariant.CHUNKED_CAUSAL_MASK:
        raise NotImplementedError(f"{op}: CHUNKED_CAUSAL_MASK is not supported yet")
    if mv is MHAMaskVariant.SLIDING_WINDOW_CAUSAL_MASK:
        if local_window_size <= 0:
            fail(op, f"SLIDING_WINDOW_CAUSAL_MASK needs local_window_size > 0, got {local_window_size}")
        return True, int(local_window_size)
    return mv is MHAMaskVariant.CAUSAL_MASK, -1


def _qkv_heads(op: str, q: TensorValue, k: TensorValue, v: TensorValue, rank: int) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.rank != rank or not t.dtype.is_float():
            fail(op, f"{name} must be a rank-{rank} float tensor, got {t.type}")
    if k.shape != v.shape or k.shape[-1] != q.shape[-1] or list(k.shape[:-2]) != list(q.shape[:-2]) \
            or int(q.shape[-2]) % int(k.shape[-2]):
        fail(op, f"q {q.shape}, k {k.shape}, v {v.shape}: k and v must match, share q's other dims and head_dim, "
                 "and their head count must divide q's")
    if q.dtype != k.dtype or k.dtype != v.dtype:
        fail(op, f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}", TypeError)


def flash_attention_gpu(q: Any, k: Any, v: Any, mask_variant: Any, scale: float, local_window_size: int = -1,
                        valid_length: Any = None) -> TensorValue:
    """``softmax(q k^T * scale + mask) v`` per batch entry and head, ``[batch, seq, heads, head_dim]``.

    ``valid_length`` (uint32 ``[batch]``): keys at or past it are masked and the query rows past it
    are zero.  K/V may have fewer heads than Q (grouped-query attention)."""
    op = "flash_attention_gpu"
    qv, kv, vv = (as_tensor(t, op=op, arg=n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    _qkv_heads(op, qv, kv, vv, 4)
    causal, window = _mask(op, mask_variant, local_window_size)
    operands = [qv, kv, vv]
    if valid_length is not None:
        vl = as_tensor(valid_length, op=op, arg="valid_length")
        if vl.rank != 1 or vl.shape[0] != qv.shape[0] or not vl.dtype.is_integral():
            fail(op, f"valid_length must be an integer [batch={qv.shape[0]}] tensor, got {vl.type}")
        operands.append(vl)
    return stage1("flash_attention_padded", operands, qv.type,
                  {"scale": float(scale), "causal": causal, "window": window, "has_valid": valid_length is not None})


def flash_attention_ragged_gpu(q: Any, k: Any, v: Any, input_row_offsets: Any, max_seq_len: Any, mask_variant: Any,
                               scale: float, local_window_size: int = -1) -> TensorValue:
    """Attention within each request of a ragged batch: ``q``/``k``/``v`` ``[total_seq_len, heads,
    head_dim]``, ``input_row_offsets`` ``[batch + 1]`` prefix sums; no KV cache."""
    op = "flash_attention_ragged_gpu"
    qv, kv, vv = (as_tensor(t, op=op, arg=n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    _qkv_heads(op, qv, kv, vv, 3)
    offs = _offsets(op, input_row_offsets)
    if isinstance(max_seq_len, int) and max_seq_len < 0:
        fail(op, f"max_seq_len must be >= 0, got {max_seq_len}")
    causal, window = _mask(op, mask_variant, local_window_size)
    return stage1("flash_attention_ragged_nocache", [qv, kv, vv, offs], qv.type,
                  {"scale": float(scale), "causal": causal, "window": window})


def cross_attention_ragged(kv_params: KVCacheParams, input: Any, input_row_offsets: Any, kv_collection: Any,
                           layer_idx: Any, mask_variant: Any, kv_input_row_offsets: Any, q_max_seq_len: Any,
                           scale: float, local_window_size: int = -1) -> TensorValue:
    """Queries ``input`` ``[total_seq_len, n_heads, head_dim]`` (or ``[total_seq_len, n_heads * head_dim]``)
    attend to positions ``0 .. kv_len[b]`` of their request's cache in layer ``layer_idx``, where
    ``kv_len[b] = kv_input_row_offsets[b + 1] - kv_input_row_offsets[b]``.  ``NULL_MASK``: every such
    key; ``CAUSAL_MASK``: query ``i`` of a request sees keys ``0 .. i``.  ``q_max_seq_len`` (the
    longest query run; a scalar) is accepted for compatibility: the kernel reads lengths from the
    offsets.  Returns the input's shape."""
    op = "cross_attention_ragged"
    coll = _coll(op, kv_collection)
    q = as_tensor(input, op=op, arg="input")
    offs = _offsets(op, input_row_offsets)
    kv_offs = _offsets(op, kv_input_row_offsets)
    layer = _layer(op, layer_idx, coll)
    D = kv_params.head_dim
    if q.rank == 2:
        if not (hasattr(q.shape[1], "dim") and int(q.shape[1]) % D == 0):
            fail(op, f"input [total_seq_len, hidden] needs hidden divisible by head_dim {D}, got {q.shape}")
    elif q.rank != 3 or int(q.shape[2]) != D:
        fail(op, f"input must be [total_seq_len, n_heads, head_dim={D}] or [total_seq_len, hidden], got {q.shape}")
    if not q.dtype.is_float():
        fail(op, f"input must be floating point, got {q.dtype}", TypeError)
    if offs.shape != kv_offs.shape:
        fail(op, f"input_row_offsets {offs.shape} and kv_input_row_offsets {kv_offs.shape} must both be [batch + 1]")
    if q_max_seq_len is not None and not isinstance(q_max_seq_len, int):
        qm = as_tensor(q_max_seq_len, op=op, arg="q_max_seq_len")
        if qm.rank > 1 or not qm.dtype.is_integral():
            fail(op, f"q_max_seq_len must be an integer scalar, got {qm.type}")
    causal, window = _mask(op, mask_variant, local_window_size)
    (out,) = _chained(op, [q, coll.blocks, coll.lookup_table, offs, kv_offs], [q.type],
                      {"layer": layer, "scale": float(scale), "causal": causal, "window": window,
                       "head_dim": D, "page_size": coll.page_size})
    return out


def _project(op: str, hidden_states: Any, weight: Any, rows: int) -> TensorValue:
    x = as_tensor(hidden_states, op=op, arg="hidden_states")
    w = as_tensor(weight, op=op, arg="weight")
    if x.rank != 2 or w.rank != 2 or int(w.shape[0]) != rows or w.shape[1] != x.shape[1]:
        fail(op, f"hidden_states must be [total_seq_len, hidden] and weight [{rows}, hidden], got {x.shape} and "
                 f"{w.shape}")
    if x.dtype != w.dtype:
        fail(op, f"hidden_states dtype {x.dtype} and weight dtype {w.dtype} differ", TypeError)
    return x @ ops.transpose(w, 0, 1)


def _write_slots(op: str, input_row_offsets: Any, coll: Any) -> list[TensorValue]:
    return _plan(op, _offsets(op, input_row_offsets), coll, "write")


def matmul_k_cache_ragged(kv_params: KVCacheParams, hidden_states: Any, input_row_offsets: Any, weight: Any,
                          kv_collection: Any, layer_idx: Any) -> None:
    """``hidden_states @ weight.T`` (``weight`` ``[n_kv_heads * head_dim, hidden]``) into the K plane of
    this step's cache slots (V untouched)."""
    op = "matmul_k_cache_ragged"
    coll = _coll(op, kv_collection)
    Hkv, D = kv_params.n_kv_heads_per_device, kv_params.head_dim
    k = _project(op, hidden_states, weight, Hkv * D)
    _, page, off = _write_slots(op, input_row_offsets, coll)
    store_kv_ragged(kv_params, ops.reshape(k, [-1, Hkv, D]), None, coll, page, off, layer_idx)


def matmul_kv_cache_ragged(kv_params: KVCacheParams, hidden_states: Any, input_row_offsets: Any, weight: Any,
                           kv_collection: Any, layer_idx: Any) -> None:
    """``hidden_states @ weight.T`` (``weight`` ``[2 * n_kv_heads * head_dim, hidden]``: K rows then V rows)
    into this step's cache slots."""
    op = "matmul_kv_cache_ragged"
    coll = _coll(op, kv_collection)
    Hkv, D = kv_params.n_kv_heads_per_device, kv_params.head_dim
    kv = _project(op, hidden_states, weight, 2 * Hkv * D)
    _, page, off = _write_slots(op, input_row_offsets, coll)
    store_kv_ragged(kv_params, ops.reshape(kv[:, :Hkv * D], [-1, Hkv, D]), ops.reshape(kv[:, Hkv * D:], [-1, Hkv, D]),
                    coll, page, off, layer_idx)


def kv_cache_ragged_radd(kv_params: KVCacheParams, a: Any, kv_collection: Any, input_row_offsets: Any,
                         batch_offset: Any, layer_idx: Any) -> None:
    """Add ``a`` ``[rows, 2 * n_kv_heads * head_dim]`` (K part then V part) into the cache slots of this
    step's tokens of requests ``batch_offset ..`` (the last requests of the batch): row ``r`` of ``a``
    is token ``input_row_offsets[batch_offset] + r`` of the step."""
    op = "kv_cache_ragged_radd"
    coll = _coll(op, kv_collection)
    layer = _layer(op, layer_idx, coll)
    Hkv, D = kv_params.n_kv_heads_per_device, kv_params.head_dim
    av = as_tensor(a, op=op, arg="a")
    if av.rank != 2 or int(av.shape[1]) != 2 * Hkv * D or not av.dtype.is_float():
        fail(op, f"a must be a float [rows, 2 * n_kv_heads * head_dim = {2 * Hkv * D}] tensor, got {av.type}")
    offs = _offsets(op, input_row_offsets)
    bo = as_tensor(batch_offset, op=op, arg="batch_offset", dtype=DType.int64)
    if bo.rank > 1 or not bo.dtype.is_integral():
        fail(op, f"batch_offset must be an integer scalar, got {bo.type}")
    _, page, off = _plan(op, offs, coll, "write")
    _chained(op, [av, coll.blocks, page, off, offs, bo.reshape([])], [], {"layer": layer, "n_kv_heads": Hkv,
                                                                         "head_dim": D})


def _store_qkv(op: str, kv_params: KVCacheParams, q: TensorValue, k: TensorValue, v: TensorValue,
               input_row_offsets: Any, kv_collection: Any, layer_idx: Any) -> TensorValue:
    coll = _coll(op, kv_collection)
    Hkv, D = kv_params.n_kv_heads_per_device, kv_params.head_dim
    _, page, off = _write_slots(op, input_row_offsets, coll)
    store_kv_ragged(kv_params, ops.reshape(k, [-1, Hkv, D]), ops.reshape(v, [-1, Hkv, D]), coll, page, off,
                    layer_idx)
    return q


def fused_qkv_ragged_matmul_quantized(kv_params: KVCacheParams, input: Any, input_row_offsets: Any, wqkv: Any,
                                      kv_collection: Any, layer_idx: Any, n_heads: int, quantization_config: Any,
                                      perm_idx: Any = None, bias: Any = None) -> TensorValue:
    """The GPTQ-quantised fused QKV projection: ``ops.qmatmul(GPTQ, quantization_config, input, wqkv)``
    (+ bias); returns Q ``[total_seq_len, n_heads * head_dim]`` and writes K and V to the cache."""
    op = "fused_qkv_ragged_matmul_quantized"
    x = as_tensor(input, op=op, arg="input")
    if x.rank != 2 or not x.dtype.is_float():
        fail(op, f"input must be a float [total_seq_len, hidden] tensor, got {x.type}")
    if quantization_config is None:
        fail(op, "quantization_config is required")
    if perm_idx is not None:  # desc_act: the input's columns in the quantised weight's row order
        x = ops.gather(x, as_tensor(perm_idx, op=op, arg="perm_idx"), axis=1)
    qkv = ops.qmatmul(QuantizationEncoding.GPTQ, quantization_config, x, as_tensor(wqkv, op=op, arg="wqkv"))
    Hkv, D = kv_params.n_kv_heads_per_device, kv_params.head_dim
    want = (n_heads + 2 * Hkv) * D
    if int(qkv.shape[-1]) != want:
        fail(op, f"wqkv projects to {qkv.shape[-1]} features, want (n_heads + 2 * n_kv_heads) * head_dim = {want}")
    if bias is not None:
        qkv = qkv + as_tensor(bias, op=op, arg="bias").cast(qkv.dtype)
    qd, kd = n_heads * D, Hkv * D
    return _store_qkv(op, kv_params, qkv[:, :qd], qkv[:, qd:qd + kd], qkv[:, qd + kd:], input_row_offsets,
                      kv_collection, layer_idx)


def unfused_qkv_ragged_matmul_gguf_quantized(kv_params: KVCacheParams, input: Any, input_row_offsets: Any,
                                             n_heads: int, q_weight: Any, k_weight: Any, v_weight: Any,
                                             quantization_encoding_q: QuantizationEncoding,
                                             quantization_encoding_k: QuantizationEncoding,
                                             quantization_encoding_v: QuantizationEncoding, kv_collection: Any,
                                             layer_idx: Any) -> TensorValue:
    """Q, K and V projections with GGML-block-quantised weights (each its own encoding, ``ops.qmatmul``):
    returns Q ``[total_seq_len, n_heads * head_dim]`` and writes K and V to the cache."""
    op = "unfused_qkv_ragged_matmul_gguf_quantized"
    x = as_tensor(input, op=op, arg="input")
    if x.rank != 2 or x.dtype != DType.float32:
        fail(op, f"input must be a float32 [total_seq_len, hidden] tensor, got {x.type}")
    Hkv, D = kv_params.n_kv_heads_per_device, kv_params.head_dim
    outs = []
    for name, w, enc, rows in (("q_weight", q_weight, quantization_encoding_q, n_heads * D),
                               ("k_weight", k_weight, quantization_encoding_k, Hkv * D),
                               ("v_weight", v_weight, quantization_encoding_v, Hkv * D)):
        if not isinstance(enc, QuantizationEncoding) or enc is QuantizationEncoding.GPTQ:
            fail(op, f"the encoding of {name} must be a GGML block encoding, got {enc!r}", TypeError)
        y = ops.qmatmul(enc, None, x, as_tensor(w, op=op, arg=name))
        if int(y.shape[-1]) != rows:
            fail(op, f"{name} projects to {y.shape[-1]} features, want {rows}")
        outs.append(y)
    return _store_qkv(op, kv_params, outs[0], outs[1], outs[2], input_row_offsets, kv_collection, layer_idx)
