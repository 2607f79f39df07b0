"""Graph values: the typed edges between nodes.

``TensorValue`` has value semantics and the arithmetic dunders; every method
calls the op of the same name in :mod:`max.graph.ops`, so each op is defined
once.  ``BufferValue`` is a mutable tensor reference; chain values order side
effects.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, Union

import numpy as np

from max.dtype import DType
from max.graph.dim import Dim
from max.graph.shape import Shape
from max.graph.type import BufferType, DeviceRef, TensorType, Type, _ChainType, _OpaqueType

T = TypeVar("T", bound=Type)


class Value(Generic[T]):
    """A symbolic value in a graph.  Do not construct it directly."""

    __slots__ = ("_graph", "_node", "_index", "_type")

    def __new__(cls, value: Any = None, *a: Any, **k: Any):  # noqa: D102
        if isinstance(value, Value):
            return _make_value(value._graph, value._node, value._index, value._type, cls)
        if cls is TensorValue and isinstance(value, (Dim, Shape, list, tuple)):
            from max.graph import ops

            return ops.shape_to_tensor(value) if not isinstance(value, Dim) else ops._common.dim_to_tensor(value)
        raise TypeError(
            f"{cls.__name__}: cannot wrap {type(value).__name__}; values are created by ops and Graph.inputs"
        )

    def __init__(self, value: Any = None, *a: Any, **k: Any) -> None:
        pass

    def __deepcopy__(self, memo: dict) -> "Value":
        """A copy belonging to the deep copy of its graph (``Graph.copy``)."""
        import copy

        new = object.__new__(type(self))
        memo[id(self)] = new
        for cls in type(self).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if slot == "__weakref__" or not hasattr(self, slot):
                    continue
                object.__setattr__(new, slot, copy.deepcopy(getattr(self, slot), memo))
        return new

    @property
    def type(self) -> T:
        """The value's type (a copy: assigning its fields leaves the graph unchanged)."""
        t = self._type
        copy = getattr(t, "_copy", None)
        return copy() if copy is not None else t  # type: ignore[return-value]

    @property
    def tensor(self) -> "TensorValue":
        if isinstance(self, TensorValue):
            return self
        raise TypeError(f"value {self._short()} of type {self._type} is not a tensor")

    @property
    def buffer(self) -> "BufferValue":
        if isinstance(self, BufferValue):
            return self
        raise TypeError(f"value {self._short()} of type {self._type} is not a buffer")

    @property
    def opaque(self) -> "_OpaqueValue":
        if isinstance(self, _OpaqueValue):
            return self
        raise TypeError(f"value {self._short()} of type {self._type} is not an opaque value")

    def to_mlir(self) -> Any:
        return self

    @classmethod
    def from_mlir(cls, value: Any) -> "Value":
        if isinstance(value, Value):
            return _make_value(value._graph, value._node, value._index, value._type)
        raise TypeError("from_mlir: there is no MLIR here; pass a Value")

    def _short(self) -> str:
        return f"{self._node.op}#{self._index}: {self._type}"

    def __repr__(self) -> str:
        t = self._type
        if hasattr(t, "dtype") and hasattr(t, "shape"):
            # MAX's form: TensorValue(dtype=float32, shape=[Dim(3)], device=cpu:0)
            return f"{type(self).__name__}(dtype={t.dtype!r}, shape={t.shape!r}, device={t.device!r})"
        return f"{type(self).__name__}({t})"

    __hash__ = object.__hash__


def _make_value(graph: Any, node: Any, index: int, typ: Type, cls: type | None = None) -> Value:
    if cls is None or cls is Value:
        if isinstance(typ, TensorType):
            cls = TensorValue
        elif isinstance(typ, BufferType):
            cls = BufferValue
        elif isinstance(typ, _ChainType):
            cls = _ChainValue
        elif isinstance(typ, _OpaqueType):
            cls = _OpaqueValue
        else:
            cls = Value
    v = object.__new__(cls)
    v._graph = graph
    v._node = node
    v._index = index
    v._type = typ
    return v


def _to_value_for_output(o: Any) -> Value:
    if isinstance(o, Value) and not _is_weight(o):
        return o
    from max.graph.ops._common import as_tensor

    return as_tensor(o, op="output")


def _is_weight(o: Any) -> bool:
    from max.graph.weight import Weight

    return isinstance(o, Weight)


def _ops():
    from max.graph import ops

    return ops


class _Shaped:
    """dtype/shape/device/rank read from the value's tensor or buffer type."""

    __slots__ = ()

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def shape(self) -> Shape:
        return self.type.shape

    @property
    def device(self) -> DeviceRef:
        return self.type.device

    @property
    def rank(self) -> int:
        return len(self.type.shape)


class TensorValue(_Shaped, Value[TensorType]):
    """A symbolic tensor with value semantics."""

    __slots__ = ()

    # -- methods (each is the op of the same name) -----------------------
    def reshape(self, shape: Any) -> "TensorValue":
        return _ops().reshape(self, shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "TensorValue":
        return _ops().flatten(self, start_dim, end_dim)

    def transpose(self, dim_1: int, dim_2: int) -> "TensorValue":
        return _ops().transpose(self, dim_1, dim_2)

    @property
    def T(self) -> "TensorValue":
        """Swap the last two dims (a no-op for rank < 2)."""
        if self.rank < 2:
            return self
        return _ops().transpose(self, -1, -2)

    def permute(self, dims: list[int]) -> "TensorValue":
        return _ops().permute(self, dims)

    def broadcast_to(self, shape: Any) -> "TensorValue":
        return _ops().broadcast_to(self, shape)

    def cast(self, dtype: DType) -> "TensorValue":
        return _ops().cast(self, dtype)

    def to(self, device: Any) -> "TensorValue":
        return _ops().transfer_to(self, device)

    def rebind(self, shape: Any, message: str = "") -> "TensorValue":
        return _ops().rebind(self, shape, message)

    def print(self, label: str = "debug_tensor") -> None:
        _ops().print(self, label)

    def argmax(self, axis: int = -1) -> "TensorValue":
        return _ops().argmax(self, axis=axis)

    def max(self, axis: int = -1) -> "TensorValue":
        return _ops().max(self, axis=axis)

    def min(self, axis: int = -1) -> "TensorValue":
        return _ops().min(self, axis=axis)

    def mean(self, axis: int = -1) -> "TensorValue":
        return _ops().mean(self, axis=axis)

    def var(self, axis: int = -1) -> "TensorValue":
        """Population variance along ``axis`` (keeps rank).  Bool tensors are a TypeError, as in MAX."""
        ops = _ops()
        if self.dtype is DType.bool:
            raise TypeError("Variance undefined for boolean values.")
        x = self if self.dtype.is_float() else ops.cast(self, DType.float32)
        mu = ops.mean(x, axis=axis)
        d = x - mu
        return ops.mean(d * d, axis=axis)

    def stdev(self, axis: int = -1) -> "TensorValue":
        """Population standard deviation along ``axis`` (keeps rank)."""
        return _ops().sqrt(self.var(axis=axis))

    # -- dunders ---------------------------------------------------------
    def __add__(self, o: Any) -> "TensorValue":
        return _ops().add(self, o)

    def __radd__(self, o: Any) -> "TensorValue":
        return _ops().add(o, self)

    def __sub__(self, o: Any) -> "TensorValue":
        return _ops().sub(self, o)

    def __rsub__(self, o: Any) -> "TensorValue":
        return _ops().sub(o, self)

    def __mul__(self, o: Any) -> "TensorValue":
        return _ops().mul(self, o)

    def __rmul__(self, o: Any) -> "TensorValue":
        return _ops().mul(o, self)

    def __truediv__(self, o: Any) -> "TensorValue":
        return _ops().div(self, o)

    def __rtruediv__(self, o: Any) -> "TensorValue":
        return _ops().div(o, self)

    def __floordiv__(self, o: Any) -> "TensorValue":
        return _ops().floor(_ops().div(self, o))

    def __rfloordiv__(self, o: Any) -> "TensorValue":
        return _ops().floor(_ops().div(o, self))

    def __mod__(self, o: Any) -> "TensorValue":
        return _ops().mod(self, o)

    def __rmod__(self, o: Any) -> "TensorValue":
        return _ops().mod(o, self)

    def __pow__(self, o: Any) -> "TensorValue":
        return _ops().pow(self, o)

    def __rpow__(self, o: Any) -> "TensorValue":
        return _ops().pow(o, self)

    def __matmul__(self, o: Any) -> "TensorValue":
        return _ops().matmul(self, o)

    def __rmatmul__(self, o: Any) -> "TensorValue":
        return _ops().matmul(o, self)

    def __neg__(self) -> "TensorValue":
        return _ops().negate(self)

    def __pos__(self) -> "TensorValue":
        return self

    def __abs__(self) -> "TensorValue":
        return _ops().abs(self)

    def __invert__(self) -> "TensorValue":
        return _ops().logical_not(self)

    def __and__(self, o: Any) -> "TensorValue":
        return _ops().logical_and(self, o)

    def __rand__(self, o: Any) -> "TensorValue":
        return _ops().logical_and(o, self)

    def __or__(self, o: Any) -> "TensorValue":
        return _ops().logical_or(self, o)

    def __ror__(self, o: Any) -> "TensorValue":
        return _ops().logical_or(o, self)

    def __xor__(self, o: Any) -> "TensorValue":
        return _ops().logical_xor(self, o)

    def __rxor__(self, o: Any) -> "TensorValue":
        return _ops().logical_xor(o, self)

    def __eq__(self, o: Any) -> "TensorValue":  # type: ignore[override]
        return _ops().equal(self, o)

    def __ne__(self, o: Any) -> "TensorValue":  # type: ignore[override]
        return _ops().not_equal(self, o)

    def __lt__(self, o: Any) -> "TensorValue":
        return _ops().greater(o, self)

    def __le__(self, o: Any) -> "TensorValue":
        return _ops().greater_equal(o, self)

    def __gt__(self, o: Any) -> "TensorValue":
        return _ops().greater(self, o)

    def __ge__(self, o: Any) -> "TensorValue":
        return _ops().greater_equal(self, o)

    def __getitem__(self, index: Any) -> "TensorValue":
        return _ops().slice_tensor(self, index)

    def __bool__(self) -> bool:
        """Always True, as in MAX: a graph value has no data while the graph is built, so Python's
        ``and``/``or``/``if`` on it do not look at its values (``x < 10 and y < 10`` is ``y < 10``);
        use ops.logical_and / ops.where / ops.cond for data-dependent logic.  ``len()`` is a TypeError
        (no ``__len__``)."""
        return True

    def __iter__(self):
        raise TypeError("a TensorValue is not iterable; index it (x[i]) or use ops.split/ops.chunk")

    __hash__ = Value.__hash__


class BufferValue(_Shaped, Value[BufferType]):
    """A mutable tensor reference inside a graph; read and written through chained ops."""

    __slots__ = ()

    def print(self, label: str = "debug_buffer") -> None:
        _ops().print(_ops().buffer_load(self), label)

    def __getitem__(self, index: Any) -> TensorValue:
        return _ops().buffer_load(self)[index]

    def __setitem__(self, index: Any, value: Any) -> None:
        _ops().buffer_store_slice(self, value, index)


class _ChainValue(Value[_ChainType]):
    __slots__ = ()


class _OpaqueValue(Value[_OpaqueType]):
    __slots__ = ()


TensorValueLike = Any  # Value[TensorType] | TensorValue | Shape | Dim | int | float | np.ndarray ...
ChainValue = _ChainValue
OpaqueValue = _OpaqueValue


# Python and numpy numbers an op accepts where a tensor is expected (weak scalars).
Numeric = Union[int, float, np.integer, np.floating]
