"""``max.engine.api``: the engine's public classes under the module path MAX uses."""

from max.engine.model import Model, MojoValue, TensorSpec
from max.engine.session import (
    CompiledModel,
    DebugConfig,
    GPUProfilingMode,
    InferenceSession,
    LogLevel,
    PrintStyle,
)

__all__ = ["CompiledModel", "DebugConfig", "GPUProfilingMode", "InferenceSession", "LogLevel", "Model",
           "MojoValue", "PrintStyle", "TensorSpec"]
