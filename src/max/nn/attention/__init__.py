"""``max.nn.attention``: attention layers over ragged batches and the paged KV cache."""

from max.nn.attention.attention_with_rope import (
    AttentionWithRope,
    AttentionWithRopeNoOpaque,
    DistributedAttentionWithRope,
    RaggedAttention,
)
from max.nn.attention.multihead_attention import MultiheadAttention
from max.nn.kernels import MHAMaskVariant

__all__ = ["AttentionWithRope", "AttentionWithRopeNoOpaque", "DistributedAttentionWithRope", "MHAMaskVariant",
           "MultiheadAttention",
           "RaggedAttention"]
