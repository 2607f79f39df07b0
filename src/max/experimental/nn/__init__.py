"""Modules over eager tensors: ``Module`` (with ``compile``), ``module_dataclass``, ``ModuleList``,
``Sequential``, ``Linear``, ``Embedding``, ``Conv2d``; norms in ``norm``, rotary embeddings in ``rope``,
low-rank adapters in ``lora``, shared subgraphs in ``subgraph``."""

from max.experimental.nn import norm, rope  # noqa: F401
from max.experimental.nn.conv import Conv2d
from max.experimental.nn.embedding import Embedding
from max.experimental.nn.linear import Linear
from max.experimental.nn.lora import LoRA, TransparentModule, lora_layers, lora_parameters
from max.experimental.nn.module import (
    CompiledModel,
    Module,
    ModuleList,
    PinnedDeviceTensor,
    Sequential,
    module_dataclass,
)
from max.experimental.nn.norm import GemmaRMSNorm, GroupNorm, LayerNorm, RMSNorm
from max.experimental.nn.rope import RotaryEmbedding, TransposedRotaryEmbedding
from max.experimental.nn.subgraph import as_subgraph

__all__ = [
    "CompiledModel", "Conv2d", "Embedding", "GemmaRMSNorm", "GroupNorm", "LayerNorm", "Linear", "LoRA", "Module",
    "ModuleList", "PinnedDeviceTensor", "RMSNorm", "RotaryEmbedding", "Sequential", "TransparentModule",
    "TransposedRotaryEmbedding", "as_subgraph", "lora_layers", "lora_parameters", "module_dataclass", "norm", "rope",
]
