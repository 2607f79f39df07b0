"""Cross-attention of the decoder's ragged queries over each request's encoder keys/values.

This is the job of the reference's ``max.nn.kernels.cross_attention_ragged``; until that op exists in
libremax the family stages it from plain graph ops here, with the same division of work: the keys/values
are computed once per request (by the encoder graph) and the step only projects its queries.  When the
kernel lands, :func:`cross_attention` is the one place to switch.
"""

from __future__ import annotations

from max.graph import TensorValue, ops

__all__ = ["cross_attention"]


def cross_attention(q: TensorValue, k_t: TensorValue, v: TensorValue, n_heads: int, scale: float) -> TensorValue:
    """``[total_seq_len, n_heads * head_dim]``: each token's softmax attention over its request's encoder rows.

    ``q`` ``[total_seq_len, n_heads * head_dim]`` (this step's tokens, ragged); ``k_t``
    ``[total_seq_len, n_heads, head_dim, source_len]`` and ``v`` ``[total_seq_len, n_heads, source_len, head_dim]``:
    the keys (transposed) and values of each token's request, laid out by the encoder graph so that the step
    reads them without copies (a decode step has one token per request, so these are the requests' own
    tensors; a prompt's few tokens repeat theirs).  No mask: a token sees every encoder position."""
    t, hd = q.shape[0], int(q.shape[1])
    d = hd // n_heads
    qh = ops.reshape(q, [t, n_heads, 1, d])
    p = ops.softmax((qh @ k_t) * scale)  # [t, h, 1, s]
    return ops.reshape(p @ v, [t, hd])
