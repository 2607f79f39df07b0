"""Cross-attention of the decoder's ragged queries over each request's encoder keys/values.

This is the job of the reference's ``max.nn.kernels.cross_attention_ragged``; until that op exists in
libremax the family stages it from plain graph ops here, with the same division of work: the keys/values
are computed once per request (by the encoder graph) and the step only projects its queries.  When the
kernel lands, :func:`cross_attention` is the one place to switch.
"""

from __future__ import annotations

from max.graph import TensorValue, ops

__all__ = ["cross_attention"]


def cross_attention(q: TensorValue, k: TensorValue, v: TensorValue, token_rows: TensorValue, n_heads: int,
                    scale: float) -> TensorValue:
    """``[total_seq_len, n_heads * head_dim]``: each token's softmax attention over its request's rows.

    ``q`` ``[total_seq_len, n_heads * head_dim]`` (this step's tokens, ragged), ``k``/``v``
    ``[batch, source_len, n_heads * head_dim]`` (one entry per request of the step, every request's
    encoder output has ``source_len`` rows), ``token_rows`` int64 ``[total_seq_len]``: each token's request
    (its index into ``k``/``v``).  No mask: a token sees every encoder position of its request."""
    t, hd = q.shape[0], int(q.shape[1])
    d = hd // n_heads
    s = k.shape[1]
    kt = ops.permute(ops.reshape(ops.gather(k, token_rows, axis=0), [t, s, n_heads, d]), [0, 2, 3, 1])  # [t,h,d,s]
    vt = ops.permute(ops.reshape(ops.gather(v, token_rows, axis=0), [t, s, n_heads, d]), [0, 2, 1, 3])  # [t,h,s,d]
    qh = ops.reshape(q, [t, n_heads, 1, d])
    p = ops.softmax((qh @ kt) * scale)  # [t, h, 1, s]
    return ops.reshape(p @ vt, [t, hd])
