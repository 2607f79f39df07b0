"""Build typed dataflow graphs: ``Graph``, values, types, ``ops`` and ``weights``."""

from max.graph.dim import AlgebraicDim, Dim, DimLike, StaticDim, SymbolicDim
from max.graph.graph import DevicePlacementPolicy, Graph, NoGraphError
from max.graph.kernel_library import KernelLibrary
from max.graph.shape import Shape, ShapeLike
from max.graph.type import (
    BufferType,
    ConvInputLayout,
    DeviceKind,
    DeviceRef,
    FilterLayout,
    TensorType,
    Type,
    _ChainType,
    _OpaqueType,
)
from max.graph.value import BufferValue, TensorValue, TensorValueLike, Value, _ChainValue, _OpaqueValue
from max.graph.weight import ShardingStrategy, Weight
from max.graph import ops  # noqa: E402  (ops import the classes above)
from max.graph import buffer_utils, dtype_promotion  # noqa: E402,F401

__all__ = [
    "AlgebraicDim",
    "BufferType",
    "BufferValue",
    "ConvInputLayout",
    "DeviceKind",
    "DevicePlacementPolicy",
    "DeviceRef",
    "Dim",
    "DimLike",
    "FilterLayout",
    "Graph",
    "NoGraphError",
    "KernelLibrary",
    "Shape",
    "ShapeLike",
    "ShardingStrategy",
    "StaticDim",
    "SymbolicDim",
    "TensorType",
    "TensorValue",
    "TensorValueLike",
    "Type",
    "Value",
    "Weight",
    "ops",
]
