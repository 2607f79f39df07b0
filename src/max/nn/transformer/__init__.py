"""``max.nn.transformer``: decoder blocks and stacks."""

from max.nn.transformer.transformer import ReturnLogits, Transformer, TransformerBlock

__all__ = ["ReturnLogits", "Transformer", "TransformerBlock"]
