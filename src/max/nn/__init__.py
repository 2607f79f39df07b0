"""``max.nn``: layers that build graph ops (``Module``/``Layer``), with weights tracked by attribute path.

Layer classes are re-exported here (``nn.Linear``, ``nn.Conv1D``,
``nn.EmbeddingV2``...).  Sub-packages ``attention``, ``kv_cache`` and
``transformer`` and the ``kernels`` module are imported on first attribute
access when they exist.
"""

from max.nn.conv import Conv1D, Conv1DV1, Conv2d, Conv2dV1, Conv3D, Conv3DV1
from max.nn.conv_transpose import ConvTranspose1d
from max.nn.embedding import Embedding, EmbeddingV1, EmbeddingV2, VocabParallelEmbedding
from max.nn.identity import Identity
from max.nn.layer import (
    Layer,
    LayerList,
    Module,
    Shardable,
    add_layer_hook,
    clear_hooks,
    recursive_named_layers,
)
from max.nn.linear import (
    MLP,
    MLPV1,
    ColumnParallelLinear,
    DistributedGemmConfig,
    RowParallelLinear,
    GPTQLinear,
    GPTQLinearV1,
    Linear,
    LinearV1,
    QLinearV1,
)
from max.nn.norm import ConstantLayerNorm, GroupNorm, LayerNorm, LayerNormV1, RMSNorm, RMSNormV1
from max.nn.rotary_embedding import (
    DeepseekYarnRopeScalingParams,
    DeepseekYarnRotaryEmbedding,
    DynamicRotaryEmbedding,
    LinearScalingParams,
    Llama3RopeScalingParams,
    Llama3RotaryEmbedding,
    LongRoPERotaryEmbedding,
    LongRoPEScalingParams,
    RotaryEmbedding,
    YarnRotaryEmbedding,
    YarnScalingParams,
)
from max.nn.fused_mlp import FusedMLP
from max.nn.missing import MissingLayer
from max.nn.sequential import Sequential
from max.nn.stacked_linear import StackedLinear

Conv2D = Conv2d  # common spelling

__all__ = [
    "AttentionWithRope",
    "ConstantLayerNorm",
    "Identity",
    "KVCacheParams",
    "MLP",
    "MoE",
    "MoEGate",
    "MultiheadAttention",
    "RaggedAttention",
    "ReturnLogits",
    "StackedLinear",
    "Transformer",
    "TransformerBlock",
    "MLPV1",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "Conv1D",
    "Conv1DV1",
    "Conv2D",
    "Conv2d",
    "Conv2dV1",
    "Conv3D",
    "Conv3DV1",
    "ConvTranspose1d",
    "FusedMLP",
    "MissingLayer",
    "DeepseekYarnRopeScalingParams",
    "DeepseekYarnRotaryEmbedding",
    "DistributedGemmConfig",
    "DynamicRotaryEmbedding",
    "Embedding",
    "EmbeddingV1",
    "EmbeddingV2",
    "GPTQLinear",
    "GPTQLinearV1",
    "GroupNorm",
    "Layer",
    "LayerList",
    "LayerNorm",
    "LayerNormV1",
    "Linear",
    "LinearScalingParams",
    "LinearV1",
    "Llama3RopeScalingParams",
    "Llama3RotaryEmbedding",
    "LongRoPERotaryEmbedding",
    "LongRoPEScalingParams",
    "MoE",
    "MoEGate",
    "Module",
    "QLinearV1",
    "RMSNorm",
    "RMSNormV1",
    "RotaryEmbedding",
    "Sequential",
    "Shardable",
    "VocabParallelEmbedding",
    "YarnRotaryEmbedding",
    "YarnScalingParams",
    "add_layer_hook",
    "clear_hooks",
    "recursive_named_layers",
]

_LAZY_SUBMODULES = ("attention", "kv_cache", "transformer", "kernels", "kernels_decoder", "sampling", "state_space")
# Names re-exported from sub-packages, imported on first access (they pull in the KV cache and
# kernels, which plain layer users do not need).
_LAZY_NAMES = {
    "AttentionWithRope": "attention", "RaggedAttention": "attention", "DistributedAttentionWithRope": "attention",
    "MultiheadAttention": "attention.multihead_attention", "KVCacheParams": "kv_cache",
    "ReturnLogits": "transformer", "Transformer": "transformer", "TransformerBlock": "transformer",
    "DistributedTransformer": "transformer", "DistributedTransformerBlock": "transformer", "Signals": "signals",
    "MoE": "moe", "MoEGate": "moe",
}


def __getattr__(name: str):
    import importlib

    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"max.nn.{name}")
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(f"max.nn.{_LAZY_NAMES[name]}"), name)
    raise AttributeError(f"module 'max.nn' has no attribute {name!r}")
