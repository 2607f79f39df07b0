"""Modules over eager tensors: ``Module`` (with ``compile``), ``module_dataclass``, ``ModuleList``,
``Sequential``, ``Linear``, ``Embedding``, ``Conv2d``; norms in ``norm``, rotary embeddings in ``rope``."""

from max.experimental.nn import norm, rope  # noqa: F401
from max.experimental.nn.conv import Conv2d
from max.experimental.nn.embedding import Embedding
from max.experimental.nn.linear import Linear
from max.experimental.nn.module import CompiledModel, Module, ModuleList, Sequential, module_dataclass

__all__ = [
    "CompiledModel", "Conv2d", "Embedding", "Linear", "Module", "ModuleList", "Sequential", "module_dataclass",
    "norm", "rope",
]
