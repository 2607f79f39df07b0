"""Graph ops the model families' decoders use beside ``max.nn.kernels``: RoPE on projected q/k
(optionally on only the first dims of each head), and writing already-projected K/V rows into the
paged cache, so projections can be any layer (quantised, LoRA-wrapped, fused or not).

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

__all__ = ["ragged_rope", "ragged_rope_tables", "ragged_write_plan", "store_kv_ragged"]


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
    ``layer_idx`` of the paged cache at the slots from :func:`ragged_write_plan`."""
    op = "store_kv_ragged"
    coll = _coll(op, kv_collection)
    layer = _layer(op, layer_idx, coll)
    kt, vt = as_tensor(k, op=op, arg="k"), as_tensor(v, op=op, arg="v")
    want = [kv_params.n_kv_heads_per_device, kv_params.head_dim]
    for name, t in (("k", kt), ("v", vt)):
        if t.rank != 3 or [int(d) for d in t.shape[1:]] != want:
            fail(op, f"{name} must be [total_seq_len, {want[0]}, {want[1]}], got {t.shape}")
    wp = as_tensor(write_page, op=op, arg="write_page")
    wo = as_tensor(write_offset, op=op, arg="write_offset")
    _chained(op, [kt, vt, coll.blocks, wp, wo], [], {"layer": layer})
