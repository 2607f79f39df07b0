"""``max.nn.attention.ragged_attention``: :class:`RaggedAttention` (attention without positional
rotation over the paged KV cache; defined in :mod:`max.nn.attention.attention_with_rope`)."""

from max.nn.attention.attention_with_rope import RaggedAttention

__all__ = ["RaggedAttention"]
