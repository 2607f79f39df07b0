"""``max.nn.kernels``: graph ops for ragged batches over the paged KV cache, and sampling helpers.

Ragged batches: the tokens of every request are concatenated into one
``[total_seq_len, ...]`` tensor; ``input_row_offsets`` (``[batch + 1]``, prefix
sums) marks where each request starts.  Request ``b``'s new token ``i`` sits
at position ``cache_lengths[b] + i``; prefill and decode requests share a step.

Each function here is a type rule staging one node; its torch kernel lives in
``max.engine.kernels.ragged``.  Functions that write the KV cache consume and
produce the graph chain, so cache writes and reads stay ordered.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from max.dtype import DType
from max.graph import BufferValue, Dim, TensorType, TensorValue, ops
from max.graph.ops._common import as_tensor, current_graph, fail, stage, stage1
from max.graph.type import _ChainType
from max.nn.kv_cache.cache_params import KVCacheParams
from max.nn.kv_cache.collection import PagedKVCacheCollection

__all__ = [
    "MHAMaskVariant",
    "apply_penalties_to_logits",
    "flash_attention_ragged",
    "fused_qk_ragged_rope",
    "fused_qkv_ragged_matmul",
    "kv_cache_get_max_seq_len",
    "merge_ragged_tensors",
    "ragged_qkv_store",
    "rms_norm_key_cache",
    "scatter_set_constant",
    "swish_glu",
    "topk_fused_sampling",
    "update_frequency_data",
]


class MHAMaskVariant(str, enum.Enum):
    CAUSAL_MASK = "causal_mask"
    NULL_MASK = "null_mask"
    SLIDING_WINDOW_CAUSAL_MASK = "sliding_window_causal_mask"
    CHUNKED_CAUSAL_MASK = "chunked_causal_mask"


_FRESH = [0]


def _fresh(name: str) -> Dim:
    _FRESH[0] += 1
    return Dim(f"{name}_{_FRESH[0]}")


def _layer(op: str, layer_idx: Any, coll: PagedKVCacheCollection) -> int:
    """The layer index as a static int (a Python int or a constant uint32 tensor)."""
    if isinstance(layer_idx, (int, np.integer)) and not isinstance(layer_idx, bool):
        idx = int(layer_idx)
    elif isinstance(layer_idx, TensorValue) and layer_idx._node.op == "constant":
        idx = int(np.asarray(layer_idx._node.attrs["value"]).reshape(-1)[0])
    else:
        fail(op, "layer_idx must be an int or a constant (e.g. ops.constant(i, DType.uint32, ...))", TypeError)
    n = int(coll.blocks.shape[2])
    if not 0 <= idx < n:
        fail(op, f"layer_idx {idx} is out of range for a cache of {n} layers")
    return idx


def _coll(op: str, c: Any) -> PagedKVCacheCollection:
    if not isinstance(c, PagedKVCacheCollection):
        fail(op, f"kv_collection must be a PagedKVCacheCollection, got {type(c).__name__}", TypeError)
    return c


def _offsets(op: str, x: Any) -> TensorValue:
    t = as_tensor(x, op=op, arg="input_row_offsets")
    if t.rank != 1 or not t.dtype.is_integral():
        fail(op, f"input_row_offsets must be a 1-D integer tensor [batch + 1], got {t.type}", TypeError)
    return t


def _plan(op: str, offsets: TensorValue, coll: PagedKVCacheCollection, part: str) -> list[TensorValue]:
    """Per-step index tensors shared by every layer (built once per graph and step inputs).

    ``part="write"``: tok_pos [T], write_page [T], write_off [T] (where each new token's K/V goes).
    ``part="read"`` (the torch attention kernel's padded layout): q_index [B, Qmax], read_page [B, Lmax],
    read_off [B, Lmax], key_valid [B, Lmax] (bool), q_pos [B, Qmax], causal_mask [B, Qmax, Lmax] (bool).
    """
    g = current_graph(op)
    key = ("ragged_plan", part, id(offsets._node), offsets._index, id(coll.blocks._node))
    cache = g.__dict__.setdefault("_ragged_plans", {})
    if key in cache:
        return cache[key]
    dev = coll.blocks.device
    i64 = DType.int64
    if part == "write":
        tq = _fresh("ragged_tokens")
        types = [TensorType(i64, [tq], dev)] * 3
    else:
        qmax = _fresh("ragged_q_max")
        lmax = _fresh("ragged_kv_max")
        bsz = coll.cache_lengths.shape[0]
        types = [
            TensorType(i64, [bsz, qmax], dev), TensorType(i64, [bsz, lmax], dev), TensorType(i64, [bsz, lmax], dev),
            TensorType(DType.bool, [bsz, lmax], dev), TensorType(i64, [bsz, qmax], dev),
            TensorType(DType.bool, [bsz, qmax, lmax], dev),
        ]
    res = stage(f"ragged_{part}_plan", [offsets, coll.cache_lengths, coll.lookup_table], types,
                {"page_size": coll.page_size, "_multi": True})
    cache[key] = res
    return res


def _chained(op: str, operands: list, result_types: list, attrs: dict) -> list:
    g = current_graph(op)
    res = g._add_node(op, operands + [g._current_chain], result_types + [_ChainType()], attrs, side_effects=True)
    g._current_chain = res[-1]
    return res[:-1]


def fused_qkv_ragged_matmul(kv_params: KVCacheParams, input: Any, input_row_offsets: Any, wqkv: Any,
                            kv_collection: Any, layer_idx: Any, n_heads: int, bias: Any = None) -> TensorValue:
    """``input @ wqkv.T`` (+bias): returns Q ``[total_seq_len, n_heads * head_dim]``; K and V go to the cache."""
    op = "fused_qkv_ragged_matmul"
    coll = _coll(op, kv_collection)
    x = as_tensor(input, op=op, arg="input")
    w = as_tensor(wqkv, op=op, arg="wqkv")
    offs = _offsets(op, input_row_offsets)
    layer = _layer(op, layer_idx, coll)
    D, Hkv = kv_params.head_dim, kv_params.n_kv_heads_per_device
    if x.rank != 2:
        fail(op, f"input must be [total_seq_len, hidden], got {x.shape}")
    want = (n_heads + 2 * Hkv) * D
    if w.rank != 2 or w.shape[0] != want or w.shape[1] != x.shape[1]:
        fail(op, f"wqkv must be [(n_heads + 2 * n_kv_heads) * head_dim, hidden] = [{want}, {x.shape[1]}], got {w.shape}")
    if x.dtype != w.dtype:
        fail(op, f"input dtype {x.dtype} and wqkv dtype {w.dtype} differ", TypeError)
    operands = [x, w]
    if bias is not None:
        b = as_tensor(bias, op=op, arg="bias")
        if b.shape != [want]:
            fail(op, f"bias must be [{want}], got {b.shape}")
        operands.append(b)
    plan = _plan(op, offs, coll, "write")
    (q,) = _chained(op, operands + [coll.blocks, plan[1], plan[2]],
                    [TensorType(x.dtype, [x.shape[0], n_heads * D], x.device)],
                    {"layer": layer, "n_heads": n_heads, "n_kv_heads": Hkv, "head_dim": D,
                     "has_bias": bias is not None})
    return q


def fused_qk_ragged_rope(kv_params: KVCacheParams, input: Any, input_row_offsets: Any, kv_collection: Any,
                         freqs_cis: Any, layer_idx: Any, interleaved: bool = True, position_ids: Any = None,
                         mrope_section: Any = None) -> TensorValue:
    """Rotate Q (returned) and this step's K in the cache by their positions (``cache_length + i``)."""
    op = "fused_qk_ragged_rope"
    coll = _coll(op, kv_collection)
    q = as_tensor(input, op=op, arg="input")
    f = as_tensor(freqs_cis, op=op, arg="freqs_cis")
    offs = _offsets(op, input_row_offsets)
    layer = _layer(op, layer_idx, coll)
    if position_ids is not None or mrope_section is not None:
        raise NotImplementedError(f"{op}: position_ids / mrope_section are not supported yet")
    if q.rank != 3 or q.shape[2] != kv_params.head_dim:
        fail(op, f"input must be [total_seq_len, n_heads, head_dim={kv_params.head_dim}], got {q.shape}")
    if f.rank != 2 or f.shape[1] != kv_params.head_dim:
        fail(op, f"freqs_cis must be [positions, head_dim={kv_params.head_dim}], got {f.shape}")
    plan = _plan(op, offs, coll, "write")
    # cos/sin of this step's positions: one pure node, shared by every layer through CSE
    half = kv_params.head_dim // 2
    tok = plan[0].shape[0]
    cos, sin = stage("ragged_rope_tables", [f, plan[0]],
                     [TensorType(DType.float32, [tok, 1, half], q.device)] * 2, {"_multi": True})
    (out,) = _chained(op, [q, cos, sin, coll.blocks, plan[1], plan[2]], [q.type],
                      {"layer": layer, "interleaved": bool(interleaved)})
    return out


def rms_norm_key_cache(kv_params: KVCacheParams, kv_collection: Any, gamma: Any, epsilon: float, layer_idx: Any,
                       total_seq_len: Any, input_row_offsets: Any, weight_offset: float = 0.0,
                       rms_norm_cols: int | None = None, multiply_before_cast: bool = True,
                       per_head_norm: bool = True) -> None:
    """RMS-normalise this step's keys in the cache, in place (per head: gamma ``[head_dim]``)."""
    op = "rms_norm_key_cache"
    coll = _coll(op, kv_collection)
    gm = as_tensor(gamma, op=op, arg="gamma")
    offs = _offsets(op, input_row_offsets)
    layer = _layer(op, layer_idx, coll)
    D, H = kv_params.head_dim, kv_params.n_kv_heads_per_device
    cols = rms_norm_cols if rms_norm_cols is not None else (D if per_head_norm else H * D)
    if gm.rank != 1 or gm.shape[0] != cols:
        fail(op, f"gamma must be [{cols}], got {gm.shape}")
    if cols not in (D, H * D):
        fail(op, f"rms_norm_cols must be head_dim ({D}) or n_kv_heads * head_dim ({H * D}), got {cols}")
    plan = _plan(op, offs, coll, "write")
    _chained(op, [gm, coll.blocks, plan[1], plan[2]], [],
             {"layer": layer, "eps": float(epsilon), "weight_offset": float(weight_offset), "cols": cols,
              "multiply_before_cast": bool(multiply_before_cast)})


def flash_attention_ragged(kv_params: KVCacheParams, input: Any, input_row_offsets: Any, kv_collection: Any,
                           layer_idx: Any, mask_variant: MHAMaskVariant | str, scale: float,
                           local_window_size: int = -1, sink_weights: Any = None) -> TensorValue:
    """Self-attention of this step's queries over each request's cached keys/values (positions ``0..pos``).

    ``SLIDING_WINDOW_CAUSAL_MASK``: the last ``local_window_size`` positions only.
    ``CHUNKED_CAUSAL_MASK`` (Llama 4's local layers): ``local_window_size`` is the chunk size; a query at
    position ``p`` attends to positions ``(p // local_window_size) * local_window_size .. p``."""
    op = "flash_attention_ragged"
    coll = _coll(op, kv_collection)
    q = as_tensor(input, op=op, arg="input")
    offs = _offsets(op, input_row_offsets)
    layer = _layer(op, layer_idx, coll)
    D = kv_params.head_dim
    if q.rank == 2:
        if not (hasattr(q.shape[1], "dim") and q.shape[1].dim % D == 0):
            fail(op, f"input [total_seq_len, hidden] needs hidden divisible by head_dim {D}, got {q.shape}")
    elif q.rank != 3 or q.shape[2] != D:
        fail(op, f"input must be [total_seq_len, n_heads, head_dim={D}] or [total_seq_len, hidden], got {q.shape}")
    mv = MHAMaskVariant(mask_variant)
    if sink_weights is not None:
        raise NotImplementedError(f"{op}: sink_weights are not supported yet")
    window = int(local_window_size) if mv is MHAMaskVariant.SLIDING_WINDOW_CAUSAL_MASK else -1
    chunk = int(local_window_size) if mv is MHAMaskVariant.CHUNKED_CAUSAL_MASK else -1
    if mv is MHAMaskVariant.CHUNKED_CAUSAL_MASK and chunk <= 0:
        fail(op, f"CHUNKED_CAUSAL_MASK needs local_window_size (the chunk size) > 0, got {local_window_size}")
    plan = _plan(op, offs, coll, "read")
    # the raw step inputs follow the padded plan: a kernel reading the pages directly needs only those
    (out,) = _chained(op, [q, coll.blocks] + plan + [offs, coll.cache_lengths, coll.lookup_table], [q.type],
                      {"layer": layer, "scale": float(scale), "causal": mv is not MHAMaskVariant.NULL_MASK,
                       "window": window, "chunk": chunk, "head_dim": D, "native_operands": True})
    return out


def ragged_qkv_store(kv_params: KVCacheParams, qkv: Any, input_row_offsets: Any, kv_collection: Any,
                     layer_idx: Any, n_heads: int, freqs_cis: Any = None, interleaved: bool = True,
                     q_norm: Any = None, k_norm: Any = None, norm_eps: float = 1e-6) -> TensorValue:
    """Split this step's projected ``qkv [total_seq_len, (n_heads + 2 n_kv_heads) * head_dim]``: return Q
    ``[total_seq_len, n_heads, head_dim]`` and write K and V to the cache (libremax extension).

    Each head of Q and K is optionally RMS-normalised (``q_norm``/``k_norm``: ``[head_dim]`` weights,
    ``norm_eps``) and then rotated by its token's position (``freqs_cis`` ``[positions, rope_dim]`` of
    (cos, sin) pairs, ``rope_dim <= head_dim``: only the first ``rope_dim`` dims of each head rotate;
    ``None``: no rotation), in that order -- QKV split, QK-norm, RoPE and the cache write of one layer
    in one kernel.
    """
    op = "ragged_qkv_store"
    coll = _coll(op, kv_collection)
    t = as_tensor(qkv, op=op, arg="qkv")
    offs = _offsets(op, input_row_offsets)
    layer = _layer(op, layer_idx, coll)
    D, Hkv = kv_params.head_dim, kv_params.n_kv_heads_per_device
    want = (n_heads + 2 * Hkv) * D
    if t.rank != 2 or not (hasattr(t.shape[1], "dim") and t.shape[1].dim == want):
        fail(op, f"qkv must be [total_seq_len, (n_heads + 2 * n_kv_heads) * head_dim] = [T, {want}], got {t.shape}")
    if not t.dtype.is_float():
        fail(op, f"qkv must be floating point, got {t.dtype}", TypeError)
    operands = [t]
    attrs: dict = {"layer": layer, "n_heads": int(n_heads), "n_kv_heads": Hkv, "head_dim": D,
                   "interleaved": bool(interleaved), "eps": float(norm_eps), "has_rope": freqs_cis is not None,
                   "has_q_norm": q_norm is not None, "has_k_norm": k_norm is not None}
    if freqs_cis is not None:
        f = as_tensor(freqs_cis, op=op, arg="freqs_cis")
        if f.rank != 2 or not hasattr(f.shape[1], "dim") or f.shape[1].dim % 2 or not 0 < f.shape[1].dim <= D:
            fail(op, f"freqs_cis must be [positions, rope_dim] with an even rope_dim <= head_dim={D}, got {f.shape}")
        operands.append(f)
    for name, gm in (("q_norm", q_norm), ("k_norm", k_norm)):
        if gm is not None:
            gv = as_tensor(gm, op=op, arg=name)
            if gv.rank != 1 or gv.shape[0] != D:
                fail(op, f"{name} must be [head_dim={D}], got {gv.shape}")
            operands.append(gv.cast(DType.float32) if gv.dtype != DType.float32 else gv)
    plan = _plan(op, offs, coll, "write")
    (q,) = _chained(op, operands + [coll.blocks, plan[0], plan[1], plan[2]],
                    [TensorType(t.dtype, [t.shape[0], n_heads, D], t.device)], attrs)
    return q


def kv_cache_get_max_seq_len(kv_params: KVCacheParams, kv_collection: Any) -> TensorValue:
    """The longest sequence (cache + new tokens) this step, as a uint32 scalar."""
    coll = _coll("kv_cache_get_max_seq_len", kv_collection)
    return stage1("kv_cache_get_max_seq_len", [coll.max_lengths], TensorType(DType.uint32, [], coll.max_lengths.device))


def swish_glu(a: Any, b0: Any, b1: Any) -> TensorValue:
    """``silu(a @ b0.T) * (a @ b1.T)``."""
    x = as_tensor(a, op="swish_glu", arg="a")
    return ops.silu(x @ ops.transpose(as_tensor(b0, op="swish_glu", arg="b0"), 0, 1)) * (
        x @ ops.transpose(as_tensor(b1, op="swish_glu", arg="b1"), 0, 1))


def topk_fused_sampling(logits: Any, top_k: Any, *, temperature: Any = 1.0, max_k: Any = None, top_p: Any = 1.0,
                        seed: Any = 0) -> TensorValue:
    """Sample one token per row of ``logits [batch, vocab]`` after top-k/top-p filtering; ``[batch, 1]`` int64."""
    op = "topk_fused_sampling"
    lg = as_tensor(logits, op=op, arg="logits")
    if lg.rank != 2 or not lg.dtype.is_float():
        fail(op, f"logits must be a float [batch, vocab] tensor, got {lg.type}")
    dev = lg.device

    def per_batch(v: Any, name: str, dt: DType) -> TensorValue:
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
            return ops.constant(np.full([1], v, dt.to_numpy()), dt, dev)
        t = as_tensor(v, op=op, arg=name)
        if t.rank > 1:
            fail(op, f"{name} must be a scalar or [batch], got {t.shape}")
        return t.cast(dt).reshape([-1]) if t.rank == 1 else t.cast(dt).reshape([1])

    if isinstance(top_k, (int, np.integer)):
        if top_k < 1:
            fail(op, f"top_k must be >= 1, got {top_k}")
    elif max_k is None:
        fail(op, "a per-batch top_k tensor needs max_k")
    if isinstance(temperature, (int, float)) and temperature < 0:
        fail(op, f"temperature must be >= 0, got {temperature}")
    if isinstance(top_p, (int, float)) and not 0 < top_p <= 1:
        fail(op, f"top_p must be in (0, 1], got {top_p}")
    k = per_batch(top_k, "top_k", DType.int64)
    t = per_batch(temperature, "temperature", DType.float32)
    p = per_batch(top_p, "top_p", DType.float32)
    s = per_batch(seed, "seed", DType.int64)
    return stage1(op, [lg, k, t, p, s], TensorType(DType.int64, [lg.shape[0], 1], dev), {})


def apply_penalties_to_logits(logits_buffer: BufferValue, frequency_data: Any, frequency_offsets: Any, *,
                              frequency_penalty: Any = 0.0, presence_penalty: Any = 0.0,
                              repetition_penalty: Any = 1.0) -> None:
    """In place: penalise each row's logits for the tokens in its ``frequency_data`` slice ``[(id, count)]``."""
    op = "apply_penalties_to_logits"
    if not isinstance(logits_buffer, BufferValue):
        fail(op, "logits_buffer must be a BufferValue", TypeError)
    fd = as_tensor(frequency_data, op=op, arg="frequency_data")
    fo = as_tensor(frequency_offsets, op=op, arg="frequency_offsets")
    if fd.rank != 2 or fd.shape[1] != 2:
        fail(op, f"frequency_data must be [unique_tokens, 2], got {fd.shape}")
    dev = logits_buffer.device

    def scalar(v: Any, name: str) -> TensorValue:
        if isinstance(v, (int, float)):
            return ops.constant(np.full([1], v, np.float32), DType.float32, dev)
        return as_tensor(v, op=op, arg=name).cast(DType.float32)

    _chained(op, [logits_buffer, fd, fo, scalar(frequency_penalty, "frequency_penalty"),
                  scalar(presence_penalty, "presence_penalty"), scalar(repetition_penalty, "repetition_penalty")],
             [], {})


def update_frequency_data(frequency_data: BufferValue, frequency_offsets: Any, tokens: Any) -> None:
    """In place: count each row's new token in its ``frequency_data`` slice."""
    op = "update_frequency_data"
    if not isinstance(frequency_data, BufferValue):
        fail(op, "frequency_data must be a BufferValue", TypeError)
    _chained(op, [frequency_data, as_tensor(frequency_offsets, op=op, arg="frequency_offsets"),
                  as_tensor(tokens, op=op, arg="tokens")], [], {})


def merge_ragged_tensors(a: Any, a_row_offsets: Any, b: Any, b_row_offsets: Any) -> tuple[TensorValue, TensorValue]:
    """Per-request concatenation of two ragged tensors: ``(merged, merged_row_offsets)``."""
    op = "merge_ragged_tensors"
    ta, tb = as_tensor(a, op=op, arg="a"), as_tensor(b, op=op, arg="b")
    oa, ob = _offsets(op, a_row_offsets), _offsets(op, b_row_offsets)
    if ta.dtype != tb.dtype or ta.rank != tb.rank or list(ta.shape[1:]) != list(tb.shape[1:]):
        fail(op, f"a {ta.type} and b {tb.type} must agree in dtype and trailing dims")
    if oa.shape != ob.shape:
        fail(op, f"a and b must have the same batch size: offsets {oa.shape} vs {ob.shape}")
    merged = TensorType(ta.dtype, [ta.shape[0] + tb.shape[0]] + list(ta.shape[1:]), ta.device)
    res = stage(op, [ta, oa, tb, ob], [merged, oa.type], {"_multi": True})
    return res[0], res[1]


def scatter_set_constant(data: BufferValue, indices: Any, fill_val: float) -> None:
    """In place: ``data[indices[i, 0], indices[i, 1], ...] = fill_val``."""
    op = "scatter_set_constant"
    if not isinstance(data, BufferValue):
        fail(op, "data must be a BufferValue", TypeError)
    idx = as_tensor(indices, op=op, arg="indices")
    if idx.rank != 2 or not idx.dtype.is_integral():
        fail(op, f"indices must be an integer [n, rank] tensor, got {idx.type}")
    _chained(op, [data, idx], [], {"fill_val": float(fill_val)})


# The entry points defined beside this module (one file per family), reached as max.nn.kernels.<name>.
# Imported on first use (PEP 562): those modules import this one's helpers, so importing any of them
# first must not depend on this module finishing theirs.
_LAZY = {
    **dict.fromkeys(["convert_weights_to_fp8_fnuz_if_needed", "dynamic_scaled_matmul",
                     "fused_qkv_ragged_matmul_scaled_float8", "matmul_static_scaled_float8",
                     "needs_fp8_fnuz_conversion", "normalize_e4m3fn_to_e4m3fnuz", "quantize_dynamic_scaled_float8",
                     "quantize_static_scaled_float8"], "max.nn.kernels_float8"),
    **dict.fromkeys(["cross_attention_ragged", "flash_attention_gpu", "flash_attention_ragged_gpu",
                     "fused_qkv_ragged_matmul_quantized", "kv_cache_ragged_radd", "matmul_k_cache_ragged",
                     "matmul_kv_cache_ragged", "unfused_qkv_ragged_matmul_gguf_quantized"],
                    "max.nn.kernels_attention"),
    **dict.fromkeys(["flare_mla_decode_ragged", "flare_mla_decompress_k_cache", "flare_mla_prefill_plan",
                     "flare_mla_prefill_ragged"], "max.nn.kernels_mla"),
    **dict.fromkeys(["grouped_matmul_ragged", "moe_create_indices"], "max.nn.moe"),
    **dict.fromkeys(["sgmv_kernel", "sgmv_lora_kernel", "sgmv_qkv_lora_kernel"], "max.nn.lora"),
}
__all__ += sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
