"""Compile graphs (``InferenceSession.load``) and run them (``Model.execute``)."""

from pathlib import Path
from typing import Any, Sequence, Union

from max.engine.model import Model, MojoValue, TensorSpec
from max.engine.session import CompiledModel, DebugConfig, GPUProfilingMode, InferenceSession, LogLevel, PrintStyle

CustomExtensionsType = Union[Sequence[Union[str, Path, Any]], str, Path, Any]

__all__ = [
    "CompiledModel",
    "CustomExtensionsType",
    "DebugConfig",
    "PrintStyle",
    "GPUProfilingMode",
    "InferenceSession",
    "LogLevel",
    "Model",
    "MojoValue",
    "TensorSpec",
]
