"""``max.nn.kernels``' multi-head latent attention (MLA, DeepSeek-V2/V3) entry points.

libremax caches one latent row per token and layer: ``[kv_lora_rank latent | qk_rope_dim rotated key]``,
``width = 2 * n_kv_heads * head_dim`` wide with ``n_kv_heads == 1`` (the row's halves sit in the K and
V planes of the paged pool; ``KVCacheParams(head_dim = width // 2, n_kv_heads = 1)``).

- :func:`flare_mla_decode_ragged` -- absorbed attention: queries already multiplied into latent space
  (``[total_seq_len, n_heads, width]``) attend over the cached rows; the values are the rows' latent
  part.  This is the attention the DeepSeek-V2 family runs (one kernel, ``mla_attention_ragged``).
- :func:`flare_mla_prefill_plan`, :func:`flare_mla_decompress_k_cache`, :func:`flare_mla_prefill_ragged`
  -- the decompressed (non-absorbed) prefill in chunks of a fixed-size buffer: the plan splits every
  request's cached positions into chunks of ``buffer_size`` rows, each chunk's latents are up-projected
  into keys/values, and attention runs chunk by chunk, merging partial softmaxes through
  ``softmax_info`` (per query and head: running max and sum of exponentials).
"""

from __future__ import annotations

from typing import Any

from max.dtype import DType
from max.graph import TensorType, TensorValue
from max.graph.ops._common import as_tensor, fail
from max.nn.kernels import MHAMaskVariant, _chained, _coll, _layer, _offsets
from max.nn.kernels_decoder import mla_attention_ragged
from max.nn.kv_cache.cache_params import KVCacheParams

__all__ = ["flare_mla_decode_ragged", "flare_mla_decompress_k_cache", "flare_mla_prefill_plan",
           "flare_mla_prefill_ragged"]


def _row_width(op: str, kv_params: KVCacheParams) -> int:
    if kv_params.n_kv_heads_per_device != 1:
        fail(op, f"the latent cache must have one KV head, got {kv_params.n_kv_heads_per_device}")
    return 2 * kv_params.head_dim


def _causal_only(op: str, mask_variant: Any) -> None:
    if MHAMaskVariant(mask_variant) is not MHAMaskVariant.CAUSAL_MASK:
        raise NotImplementedError(f"{op}: only CAUSAL_MASK is supported, got {MHAMaskVariant(mask_variant).name}")


def flare_mla_decode_ragged(kv_params: KVCacheParams, input: Any, input_row_offsets: Any, kv_collection: Any,
                            layer_idx: Any, mask_variant: Any, scale: float, qk_rope_dim: int = 64) -> TensorValue:
    """Absorbed MLA: ``input`` ``[total_seq_len, n_heads, width]`` (latent query | rotated query) attends
    causally over each request's cached rows; returns ``[total_seq_len, n_heads, width - qk_rope_dim]``
    (attention-weighted latents).  Serves decode and prefill steps alike."""
    op = "flare_mla_decode_ragged"
    width = _row_width(op, kv_params)
    _causal_only(op, mask_variant)
    if not 0 <= qk_rope_dim < width:
        fail(op, f"qk_rope_dim must be in [0, {width}), got {qk_rope_dim}")
    return mla_attention_ragged(kv_params, input, input_row_offsets, kv_collection, layer_idx, scale,
                                width - qk_rope_dim)


def flare_mla_prefill_plan(kv_params: KVCacheParams, input_row_offsets: Any, kv_collection: Any, layer_idx: Any,
                           buffer_size: int, max_chunks: int = 16) -> tuple[TensorValue, TensorValue, TensorValue]:
    """Split the cached positions of every request (``cache_length + new tokens``, requests one after
    another) into chunks of ``buffer_size`` rows.  Returns int32 ``buffer_row_offsets`` ``[max_chunks,
    batch + 1]`` (where each request's rows start in chunk ``c``'s buffer), ``cache_offsets``
    ``[max_chunks, batch]`` (the cache position of a request's first row in chunk ``c``) and
    ``buffer_lengths`` ``[max_chunks]`` (rows in chunk ``c``; -1 for chunks past the end).  Running a
    batch that needs more than ``max_chunks`` chunks raises ValueError."""
    op = "flare_mla_prefill_plan"
    coll = _coll(op, kv_collection)
    offs = _offsets(op, input_row_offsets)
    _layer(op, layer_idx, coll)
    _row_width(op, kv_params)
    if buffer_size < 1 or max_chunks < 1:
        fail(op, f"buffer_size and max_chunks must be >= 1, got {buffer_size} and {max_chunks}")
    B = coll.cache_lengths.shape[0]
    dev = offs.device
    i32 = DType.int32
    res = _chained(op, [offs, coll.cache_lengths],
                   [TensorType(i32, [max_chunks, B + 1], dev), TensorType(i32, [max_chunks, B], dev),
                    TensorType(i32, [max_chunks], dev)],
                   {"buffer_size": int(buffer_size), "max_chunks": int(max_chunks)})
    return res[0], res[1], res[2]


def flare_mla_decompress_k_cache(kv_params: KVCacheParams, buffer_row_offsets_1d: Any, cache_offsets_1d: Any,
                                 buffer_length: Any, weight: Any, kv_collection: Any, layer_idx: Any,
                                 buffer_size: int) -> TensorValue:
    """Gather one chunk's cached latents (the first ``weight.shape[1]`` entries of each row) into a
    ``buffer_size``-row buffer and up-project: ``[buffer_size, weight.shape[0]]``.  Request ``b``'s rows
    ``buffer_row_offsets_1d[b] ..`` hold its positions from ``cache_offsets_1d[b]`` on; rows at or
    past ``buffer_length`` are zero."""
    op = "flare_mla_decompress_k_cache"
    coll = _coll(op, kv_collection)
    layer = _layer(op, layer_idx, coll)
    width = _row_width(op, kv_params)
    bro = _offsets(op, buffer_row_offsets_1d)
    co = as_tensor(cache_offsets_1d, op=op, arg="cache_offsets_1d")
    bl = as_tensor(buffer_length, op=op, arg="buffer_length")
    w = as_tensor(weight, op=op, arg="weight")
    if co.rank != 1 or not co.dtype.is_integral() or bl.rank > 1 or not bl.dtype.is_integral():
        fail(op, f"cache_offsets_1d must be 1-D and buffer_length a scalar, both integer; got {co.type}, {bl.type}")
    if w.rank != 2 or not 0 < int(w.shape[1]) <= width or not w.dtype.is_float():
        fail(op, f"weight must be a float [out, latent <= {width}] matrix, got {w.type}")
    (out,) = _chained(op, [bro, co, bl.reshape([]), w, coll.blocks, coll.lookup_table],
                      [TensorType(w.dtype, [buffer_size, w.shape[0]], w.device)],
                      {"layer": layer, "page_size": coll.page_size, "buffer_size": int(buffer_size)})
    return out


def flare_mla_prefill_ragged(kv_params: KVCacheParams, input: Any, k: Any, v: Any, input_row_offsets: Any,
                             buffer_row_offsets: Any, cache_offsets: Any, kv_collection: Any, layer_idx: Any,
                             mask_variant: Any, scale: float, qk_rope_dim: int = 64, prev_output: Any = None,
                             prev_softmax_info: Any = None) -> tuple[TensorValue, TensorValue]:
    """One chunk of the decompressed MLA prefill.

    ``input`` ``[total_seq_len, n_heads, qk_nope + qk_rope_dim]`` (query ``i`` of request ``b`` sits at
    position ``cache_length[b] + i``), ``k`` ``[buffer, n_heads, qk_nope]`` and ``v`` ``[buffer, n_heads,
    v_dim]`` the chunk's decompressed keys/values; a key's rotated part is its cached row's last
    ``qk_rope_dim`` entries.  Causal.  Returns ``(output [total_seq_len, n_heads, v_dim], softmax_info
    [total_seq_len, n_heads, 2] float32)``, merged with ``prev_output``/``prev_softmax_info`` (the
    previous chunk's) when given."""
    op = "flare_mla_prefill_ragged"
    coll = _coll(op, kv_collection)
    layer = _layer(op, layer_idx, coll)
    width = _row_width(op, kv_params)
    _causal_only(op, mask_variant)
    q = as_tensor(input, op=op, arg="input")
    kv_, vv = as_tensor(k, op=op, arg="k"), as_tensor(v, op=op, arg="v")
    offs = _offsets(op, input_row_offsets)
    bro = _offsets(op, buffer_row_offsets)
    co = as_tensor(cache_offsets, op=op, arg="cache_offsets")
    if q.rank != 3 or kv_.rank != 3 or vv.rank != 3 or q.shape[1] != kv_.shape[1] or kv_.shape[1] != vv.shape[1]:
        fail(op, f"input [T, H, qk], k [buffer, H, nope] and v [buffer, H, v_dim] must share H; got {q.shape}, "
                 f"{kv_.shape}, {vv.shape}")
    if kv_.shape[0] != vv.shape[0] or int(q.shape[2]) != int(kv_.shape[2]) + qk_rope_dim or qk_rope_dim > width:
        fail(op, f"input's last dim must be k's ({kv_.shape[2]}) + qk_rope_dim ({qk_rope_dim}) and k, v must have "
                 f"the same rows; got {q.shape}, {kv_.shape}, {vv.shape}")
    out_t = TensorType(q.dtype, [q.shape[0], q.shape[1], vv.shape[2]], q.device)
    info_t = TensorType(DType.float32, [q.shape[0], q.shape[1], 2], q.device)
    operands = [q, kv_, vv, offs, bro, co, coll.blocks, coll.cache_lengths, coll.lookup_table]
    if (prev_output is None) != (prev_softmax_info is None):
        fail(op, "prev_output and prev_softmax_info go together")
    if prev_output is not None:
        po, pi = as_tensor(prev_output, op=op, arg="prev_output"), as_tensor(prev_softmax_info, op=op,
                                                                              arg="prev_softmax_info")
        if po.shape != out_t.shape or pi.shape != info_t.shape:
            fail(op, f"prev_output must be {out_t.shape} and prev_softmax_info {info_t.shape}, got {po.shape}, "
                     f"{pi.shape}")
        operands += [po, pi.cast(DType.float32)]
    res = _chained(op, operands, [out_t, info_t], {"layer": layer, "scale": float(scale), "rope_dim": int(qk_rope_dim),
                                                   "page_size": coll.page_size, "has_prev": prev_output is not None})
    return res[0], res[1]
