"""Graph ops the model families' decoders use beside ``max.nn.kernels``: RoPE on tensors that are not
a layer's q/k heads (DeepSeek's shared RoPE key), writing K/V rows of any layout into the paged cache
(the MLA latent), attention with sinks / soft-capping, and absorbed latent attention.

Each function is a type rule staging one node; its torch kernel lives in
``max.engine.kernels.decoder``.  Ragged layout and cache addressing as in ``max.nn.kernels``.
"""

from __future__ import annotations

from typing import Any

from max.dtype import DType
from max.graph import TensorType, TensorValue
from max.graph.ops._common import as_tensor, fail, stage
from max.nn.kernels import _chained, _coll, _layer, _offsets, _plan
from max.nn.kv_cache.cache_params import KVCacheParams

__all__ = ["mla_attention_ragged", "ragged_attention", "ragged_rope", "ragged_rope_tables", "ragged_write_plan",
           "store_kv_ragged"]


def ragged_write_plan(input_row_offsets: Any, kv_collection: Any) -> tuple[TensorValue, TensorValue, TensorValue]:
    """``(positions, write_page, write_offset)``, each int64 ``[total_seq_len]``: token ``t``'s position
    in its request (``cache_length + i``) and the cache slot its K/V go to.  One node per graph and
    step inputs (shared with ``max.nn.kernels``' ops): every layer's call returns the same values."""
    op = "ragged_write_plan"
    coll = _coll(op, kv_collection)
    offs = _offsets(op, input_row_offsets)
    res = _plan(op, offs, coll, "write")
    return res[0], res[1], res[2]


def ragged_rope_tables(freqs_cis: Any, positions: Any) -> tuple[TensorValue, TensorValue]:
    """``(cos, sin)``, float32 ``[total_seq_len, 1, rope_dim // 2]``, of each token's position from a
    ``[max_positions, rope_dim]`` table of interleaved (cos, sin) pairs (``RotaryEmbedding.freqs_cis``)."""
    op = "ragged_rope_tables"
    f = as_tensor(freqs_cis, op=op, arg="freqs_cis")
    p = as_tensor(positions, op=op, arg="positions")
    if f.rank != 2 or int(f.shape[1]) % 2:
        fail(op, f"freqs_cis must be [positions, rope_dim] with an even rope_dim, got {f.shape}")
    if p.rank != 1 or not p.dtype.is_integral():
        fail(op, f"positions must be a 1-D integer tensor, got {p.type}")
    t = TensorType(DType.float32, [p.shape[0], 1, int(f.shape[1]) // 2], f.device)
    res = stage("ragged_rope_tables", [f, p], [t, t], {"_multi": True})
    return res[0], res[1]


def ragged_rope(x: Any, cos: Any, sin: Any, interleaved: bool = False) -> TensorValue:
    """Rotate ``x`` ``[total_seq_len, n_heads, head_dim]`` by its tokens' angles.

    Only the first ``2 * cos.shape[-1]`` dims of each head rotate (partial rotary embeddings);
    the rest pass through.  ``interleaved``: pairs are ``(2i, 2i+1)``, else ``(i, i + rot/2)``.
    """
    op = "ragged_rope"
    v = as_tensor(x, op=op, arg="x")
    c = as_tensor(cos, op=op, arg="cos")
    s = as_tensor(sin, op=op, arg="sin")
    if v.rank != 3 or not v.dtype.is_float():
        fail(op, f"x must be a float [total_seq_len, n_heads, head_dim] tensor, got {v.type}")
    if c.rank != 3 or c.shape != s.shape:
        fail(op, f"cos and sin must both be [total_seq_len, 1, rope_dim // 2], got {c.shape} and {s.shape}")
    if 2 * int(c.shape[2]) > int(v.shape[2]):
        fail(op, f"rope_dim {2 * int(c.shape[2])} exceeds head_dim {v.shape[2]}")
    return stage(op, [v, c, s], [v.type], {"interleaved": bool(interleaved)})[0]


def store_kv_ragged(kv_params: KVCacheParams, k: Any, v: Any, kv_collection: Any, write_page: Any,
                    write_offset: Any, layer_idx: Any) -> None:
    """Write this step's keys and values ``[total_seq_len, n_kv_heads, head_dim]`` into layer
    ``layer_idx`` of the paged cache at the slots from :func:`ragged_write_plan` (``v=None``: keys only)."""
    op = "store_kv_ragged"
    coll = _coll(op, kv_collection)
    layer = _layer(op, layer_idx, coll)
    kt = as_tensor(k, op=op, arg="k")
    vt = as_tensor(v, op=op, arg="v") if v is not None else None
    want = [kv_params.n_kv_heads_per_device, kv_params.head_dim]
    for name, t in (("k", kt), ("v", vt)):
        if t is not None and (t.rank != 3 or [int(d) for d in t.shape[1:]] != want):
            fail(op, f"{name} must be [total_seq_len, {want[0]}, {want[1]}], got {t.shape}")
    wp = as_tensor(write_page, op=op, arg="write_page")
    wo = as_tensor(write_offset, op=op, arg="write_offset")
    _chained(op, [kt] + ([vt] if vt is not None else []) + [coll.blocks, wp, wo], [],
             {"layer": layer, "has_v": vt is not None})


def ragged_attention(kv_params: KVCacheParams, q: Any, input_row_offsets: Any, kv_collection: Any, layer_idx: Any,
                     scale: float, window: int | None = None, sinks: Any = None,
                     softcap: float | None = None, groups: Any = None, chunk: int | None = None) -> TensorValue:
    """Causal attention of this step's queries ``[total_seq_len, n_heads, head_dim]`` over each request's
    cached keys/values, with what ``max.nn.kernels.flash_attention_ragged`` lacks: attention sinks
    (``sinks`` ``[n_heads]``: one extra logit per head in the softmax's denominator, GPT-OSS) and
    logit soft-capping (``softcap * tanh(scores / softcap)``, Gemma 2).  ``window``: sliding window.
    ``chunk``: chunked local attention (Llama 4): a query at position ``p`` attends only to the keys of
    its own chunk, positions ``chunk * (p // chunk) .. p`` (alone, ``flash_attention_ragged``'s
    ``CHUNKED_CAUSAL_MASK`` does the same; here it combines with the features above).

    ``groups`` (int64 ``[total_seq_len]``): a block id per token of this step (-1: none); a query also
    attends to the later keys of this step that carry its own block id (bidirectional attention within
    an image's tokens, Gemma 3).  The sliding window still applies: ``AND(window, OR(causal, block))``.
    A step whose tokens carry no block id (decode steps, text-only prompts) is plain causal attention and
    runs ``flash_attention_ragged``'s kernel."""
    op = "ragged_attention"
    coll = _coll(op, kv_collection)
    qv = as_tensor(q, op=op, arg="q")
    offs = _offsets(op, input_row_offsets)
    layer = _layer(op, layer_idx, coll)
    D = kv_params.head_dim
    if qv.rank != 3 or int(qv.shape[2]) != D:
        fail(op, f"q must be [total_seq_len, n_heads, head_dim={D}], got {qv.shape}")
    operands = [qv, coll.blocks] + _plan(op, offs, coll, "read")
    if sinks is not None:
        sv = as_tensor(sinks, op=op, arg="sinks")
        if sv.rank != 1 or sv.shape[0] != qv.shape[1]:
            fail(op, f"sinks must be [n_heads={qv.shape[1]}], got {sv.shape}")
        operands.append(sv)
    if groups is not None:
        gv = as_tensor(groups, op=op, arg="groups")
        if gv.rank != 1 or gv.dtype is not DType.int64:
            fail(op, f"groups must be an int64 [total_seq_len] tensor, got {gv.type}")
        # the raw step inputs too: a step without any block runs the paged kernel flash_attention_ragged uses
        operands += [gv, offs, coll.cache_lengths, coll.lookup_table]
    if softcap is not None and softcap <= 0:
        fail(op, f"softcap must be > 0, got {softcap}")
    if chunk is not None and int(chunk) <= 0:
        fail(op, f"chunk must be > 0, got {chunk}")
    (out,) = _chained(op, operands, [qv.type], {"layer": layer, "scale": float(scale), "window": int(window or -1),
                                                "softcap": float(softcap or 0.0), "has_sinks": sinks is not None,
                                                "has_groups": groups is not None, "chunk": int(chunk or 0)})
    return out


def mla_attention_ragged(kv_params: KVCacheParams, q: Any, input_row_offsets: Any, kv_collection: Any,
                         layer_idx: Any, scale: float, latent_dim: int) -> TensorValue:
    """Absorbed multi-head latent attention: queries ``[total_seq_len, n_heads, width]`` attend over each
    request's cached latent rows (``width`` = the K plane's and V plane's halves of one KV head, joined);
    the values are the rows' first ``latent_dim`` entries.  Returns ``[total_seq_len, n_heads, latent_dim]``."""
    op = "mla_attention_ragged"
    coll = _coll(op, kv_collection)
    qv = as_tensor(q, op=op, arg="q")
    offs = _offsets(op, input_row_offsets)
    layer = _layer(op, layer_idx, coll)
    width = 2 * kv_params.n_kv_heads_per_device * kv_params.head_dim
    if kv_params.n_kv_heads_per_device != 1:
        fail(op, f"the latent cache must have one KV head, got {kv_params.n_kv_heads_per_device}")
    if qv.rank != 3 or int(qv.shape[2]) != width:
        fail(op, f"q must be [total_seq_len, n_heads, {width}], got {qv.shape}")
    if not 0 < latent_dim <= width:
        fail(op, f"latent_dim must be in (0, {width}], got {latent_dim}")
    out_t = TensorType(qv.dtype, [qv.shape[0], qv.shape[1], latent_dim], qv.device)
    (out,) = _chained(op, [qv, coll.blocks] + _plan(op, offs, coll, "read"), [out_t],
                      {"layer": layer, "scale": float(scale), "latent_dim": int(latent_dim)})
    return out
