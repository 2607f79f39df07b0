"""``max.nn``: layers that build graph ops (``Module``/``Layer``), with weights tracked by attribute path.

Layer classes are re-exported here (``nn.Linear``, ``nn.Conv1D``,
``nn.EmbeddingV2``...).  Sub-packages ``attention``, ``kv_cache`` and
``transformer`` and the ``kernels`` module are imported on first attribute
access when they exist.
"""

from max.nn.conv import Conv1D, Conv1DV1, Conv2d, Conv2dV1, Conv3D, Conv3DV1
from max.nn.embedding import Embedding, EmbeddingV1, EmbeddingV2, VocabParallelEmbedding
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
    GPTQLinear,
    GPTQLinearV1,
    Linear,
    LinearV1,
    QLinearV1,
)
from max.nn.norm import GroupNorm, LayerNorm, LayerNormV1, RMSNorm, RMSNormV1
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
from max.nn.moe import MoE, MoEGate
from max.nn.sequential import Sequential

Conv2D = Conv2d  # common spelling

__all__ = [
    "MLP",
    "MLPV1",
    "ColumnParallelLinear",
    "Conv1D",
    "Conv1DV1",
    "Conv2D",
    "Conv2d",
    "Conv2dV1",
    "Conv3D",
    "Conv3DV1",
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

_LAZY_SUBMODULES = ("attention", "kv_cache", "transformer", "kernels", "kernels_decoder")


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f"max.nn.{name}")
    raise AttributeError(f"module 'max.nn' has no attribute {name!r}")
