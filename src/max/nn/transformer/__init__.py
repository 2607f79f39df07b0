"""``max.nn.transformer``: decoder blocks and stacks (one device, or split over several)."""

from max.nn.transformer.distributed_transformer import (
    DistributedTransformer,
    DistributedTransformerBlock,
    ShardableCallable,
    distribute_value,
)
from max.nn.transformer.transformer import ReturnLogits, Transformer, TransformerBlock

__all__ = ["DistributedTransformer", "DistributedTransformerBlock", "ReturnLogits", "ShardableCallable",
           "Transformer", "TransformerBlock", "distribute_value"]
