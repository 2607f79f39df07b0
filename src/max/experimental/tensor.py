"""Eager and lazy tensors on top of ``max.graph`` and ``max.engine``.

How an op on :class:`Tensor` runs (see ``functional``):

* The op's graph function (``max.graph.ops.X``, its one definition) is called
  with ``Graph.current`` set to the global :class:`ComputeGraph`'s graph, the
  tensors standing in as graph values.  Its type rule therefore runs at the
  call, so an illegal op raises there.
* **Eager** (the default; all inputs realized): every node the op stages is
  executed at once by its engine kernel (``max.engine.kernels``), and the
  results are realized tensors.  Nothing is appended to the graph.
* **Lazy** (inside :func:`lazy`, or when an input is unrealized): nodes are
  appended to the compute graph; realized inputs become its *sources*.  A
  tensor realizes when a value is needed (``item``, ``repr``, DLPack, numpy,
  ``realize``): :meth:`ComputeGraph.evaluate` prunes dead nodes, compiles the
  rest with ``InferenceSession`` (compile cache keyed by graph structure) and
  realizes every live unrealized tensor.
* **Memoised replay** (``_replay``): an eager call whose arguments were seen
  before replays the recorded kernels directly.
* **Traced** (``_trace``): inside ``Module.compile`` or a module called in a
  ``Graph``, tensors stand for values of that graph and ops stage nodes there.

The jobs live in their own modules: defaults and modes (``_context``), the
compute graph (``_compute``), replay (``_replay``), dispatch of an op on tensors
(``_dispatch``) and module tracing (``_trace``); this module holds ``Tensor``.
"""

from __future__ import annotations

import builtins

import math
import warnings
import collections.abc
import numbers
from typing import Any, Iterator

import numpy as np
import torch

from max import driver
from max.driver import Buffer
from max.driver.values_text import values_text
from max.dtype import DType
from max.experimental import _compute, _dispatch, _replay
from max.experimental._compute import (  # noqa: F401 - re-exported
    ComputeGraph,
    _ComputeIR,
    _dtype_of,
    _ENode,
    _torch_type,
    _vdata,
    driver_tensor_type,
)
from max.experimental._context import (  # noqa: F401 - re-exported
    _TRACE,
    _default_device,
    _default_dtype,
    _resolve,
    contextvar_context,
    default_device,
    default_dtype,
    defaults,
    defaults_like,
    lazy,
)
from max.experimental._dispatch import functional  # noqa: F401 - re-exported
from max.graph.graph import _ACTIVE, Graph
from max.graph.shape import Shape
from max.graph.type import DeviceRef, TensorType
from max.graph.value import TensorValue, Value, _make_value

__all__ = [
    "ComputeGraph",
    "Tensor",
    "contextvar_context",
    "default_device",
    "default_dtype",
    "defaults",
    "defaults_like",
    "driver_tensor_type",
    "functional",
    "lazy",
    "GRAPH",
]


def _F():
    from max.experimental import functional as F

    return F


class Tensor:
    """A multi-dimensional array that may be realized (backed by memory) or not.

    ``Tensor(data, dtype=None, device=None)`` makes a realized tensor from a
    number, a nested list, a numpy array or any DLPack array (numpy, torch,
    ``driver.Buffer``, another ``Tensor``): arrays keep their dtype and share
    memory when no conversion is asked for; Python data takes ``dtype`` (the
    default dtype when omitted, bool for all-bool data).  ``storage=`` wraps
    a driver Buffer, ``value=``/``state=`` a graph value.

    Illegal operations raise at the call.  Whether a tensor has been computed
    yet is not observable through its values: anything that reads them
    realizes it first.
    """

    __slots__ = ("_t", "_value", "_key", "_storage", "__weakref__")

    def __init__(self, data: Any = None, *, dtype: DType | None = None, device: Any = None,
                 storage: Any = None, state: Any = None, value: Any = None) -> None:
        self._t = None
        self._value = None
        self._key = None
        self._storage = None
        if state is not None:
            if value is not None:
                raise TypeError("Tensor: pass value= or state=, not both")
            value = state
        if data is not None:
            if storage is not None or value is not None:
                raise TypeError("Tensor: pass data, storage= or value=, not several")
            src = _from_data(data, dtype, device)
            self._t, self._storage, self._value = src._t, src._storage, src._value
            if self._t is None and self._value is not None and self._value._graph is GRAPH.graph:
                GRAPH.unrealized.add(self)  # built inside lazy(): computed with the compute graph
            return
        if storage is None and value is None:
            raise TypeError(
                "Tensor: pass data (a number, nested list or DLPack array), storage= (a driver Buffer) or "
                "value= (a graph value); or use Tensor.zeros / ones / full / arange / from_dlpack"
            )
        if storage is not None:
            if not isinstance(storage, Buffer):
                raise TypeError(f"Tensor: storage must be a driver.Tensor/Buffer, got {type(storage).__name__}")
            self._t = storage._torch()
            self._storage = storage
        if value is not None:
            if not isinstance(value, TensorValue):
                raise TypeError(f"Tensor: value must be a TensorValue, got {type(value).__name__}")
            if value._graph is not GRAPH.graph:
                trace = _TRACE.get()
                if trace is None or not trace.owns(value):
                    raise ValueError(
                        "Tensor: value must belong to the global compute graph (tensor.GRAPH.graph) or to "
                        f"the graph being traced, not to graph {value._graph.name!r}"
                    )
                if storage is not None:
                    raise ValueError("Tensor: a traced (symbolic) tensor has no storage")
                self._value = value
                return
            if storage is not None:
                if _torch_type(self._t) != value.type and Shape.is_static(value.type.shape):
                    raise ValueError(f"Tensor: storage {driver_tensor_type(storage)} does not match value type {value.type}")
                node = value._node
                data = list(node.data) if node.data is not None else [None] * len(node.results)
                data[value._index] = self._t
                node.data = tuple(data)
            self._value = value
            if self._t is None:
                d = _vdata(value)
                if d is not None:
                    self._t = d
                else:
                    GRAPH.unrealized.add(self)

    # -- construction helpers (internal) -------------------------------------------
    @classmethod
    def _new(cls, t: torch.Tensor) -> "Tensor":
        self = object.__new__(cls)
        self._t = t
        self._value = None
        self._key = None
        self._storage = None
        return self

    @classmethod
    def _realized(cls, t: torch.Tensor, value: Value | None) -> "Tensor":
        self = cls._new(t)
        self._value = value
        return self

    @property
    def _symbolic(self) -> bool:
        """A tensor standing for a value of a traced graph (no data, ever)."""
        v = self._value
        return self._t is None and v is not None and v._graph is not GRAPH.graph

    def _graph_value(self, g: Graph) -> TensorValue:
        v = self._value
        if v is not None and v._graph is g:
            return v
        node = _ENode(g, "source", (), {}, "<tensor>")
        node.data = (self._t,)
        v = _make_value(g, node, 0, _torch_type(self._t))
        node.results = (v,)
        self._value = v
        return v  # type: ignore[return-value]

    def __tensorvalue__(self) -> TensorValue:
        """This tensor as a value of the graph being built: its own value in the compute graph or a
        traced graph, a weight while compiling a module, else a constant."""
        active = _ACTIVE.get()
        g = active[-1] if active else GRAPH.graph
        if g is GRAPH.graph or isinstance(g, _ComputeIR):
            return self._graph_value(g)
        v = self._value
        if v is not None and (v._graph is g or g._can_see(v._graph)):
            return v
        if self._symbolic:
            raise ValueError(f"a tensor traced in graph {v._graph.name!r} cannot be used in graph {g.name!r}")
        trace = _TRACE.get()
        if trace is not None:
            bound = trace.bind(self, g)
            if bound is not None:
                return bound
        from max.graph import ops

        return ops.constant(self.to_numpy(), self.dtype, DeviceRef.from_device(self.device))

    # -- factories -----------------------------------------------------------------
    @classmethod
    def constant(cls, value: Any, *, dtype: DType | None = None, device: Any = None) -> "Tensor":
        """A tensor holding ``value`` (an array, a number or a nested sequence) as ``dtype``.

        Deprecated (as in MAX 26.7): warns ``DeprecationWarning``; use ``Tensor(value, dtype=..., device=...)``."""
        warnings.warn("Tensor.constant() is deprecated. Use Tensor(value, dtype=dtype, device=device) instead.",
                      DeprecationWarning, stacklevel=2)
        return cls._constant(value, dtype=dtype, device=device)

    @classmethod
    def _constant(cls, value: Any, *, dtype: DType | None = None, device: Any = None) -> "Tensor":
        dtype, device = _resolve(dtype, device)
        return _F().constant(value, dtype, device)

    @classmethod
    def full(cls, shape: Any, value: Any, *, dtype: DType | None = None, device: Any = None) -> "Tensor":
        """A tensor of ``shape`` filled with ``value``."""
        dtype, device = _resolve(dtype, device)
        F = _F()
        return F.broadcast_to(F.constant(value, dtype, device), _shape_arg(shape))

    @classmethod
    def zeros(cls, shape: Any, *, dtype: DType | None = None, device: Any = None) -> "Tensor":
        return cls.full(shape, 0, dtype=dtype, device=device)

    @classmethod
    def ones(cls, shape: Any, *, dtype: DType | None = None, device: Any = None) -> "Tensor":
        return cls.full(shape, 1, dtype=dtype, device=device)

    @classmethod
    def full_like(cls, like: Any, value: Any, *, dtype: DType | None = None, device: Any = None) -> "Tensor":
        """A tensor with ``like``'s shape, dtype and device (``like``: a Tensor or a TensorType),
        filled with ``value``; ``dtype``/``device`` override ``like``'s."""
        t = _like_type(like, "full_like")
        return cls.full(t.shape, value, dtype=dtype or t.dtype,
                        device=device if device is not None else t.device.to_device())

    @classmethod
    def zeros_like(cls, like: Any, *, dtype: DType | None = None, device: Any = None) -> "Tensor":
        return cls.full_like(like, 0, dtype=dtype, device=device)

    @classmethod
    def ones_like(cls, like: Any, *, dtype: DType | None = None, device: Any = None) -> "Tensor":
        return cls.full_like(like, 1, dtype=dtype, device=device)

    @classmethod
    def arange(cls, start: Any = 0, stop: Any = None, step: Any = 1, *, dtype: DType | None = None,
               device: Any = None) -> "Tensor":
        """``start, start + step, ...`` below ``stop`` (``arange(n)`` counts from 0)."""
        if stop is None:
            start, stop = 0, start
        dtype, device = _resolve(dtype, device)
        return _F().range(start, stop, step, dtype=dtype, device=device)

    @classmethod
    def range_like(cls, type: "Tensor") -> "Tensor":  # noqa: A002 - reference name
        """A tensor with ``type``'s shape, dtype and device whose last axis counts ``0 .. n - 1``
        at every other index (``r[1, 2, :] == [0, 1, ..., n - 1]``).

        As in MAX 26.7 ``type`` is a Tensor: passing its ``TensorType`` is MAX's
        AttributeError (``'TensorType' object has no attribute 'layout'``)."""
        if not isinstance(type, Tensor):
            raise AttributeError(f"'{builtins.type(type).__name__}' object has no attribute 'layout'")
        shape = type.shape
        if len(shape) == 0:
            return cls.zeros([], dtype=type.dtype, device=type.device)
        r = cls.arange(0, shape[-1], 1, dtype=type.dtype, device=type.device)
        return r.broadcast_to(shape)

    @classmethod
    def from_dim(cls, dim: Any, *, dtype: DType | None = None, device: Any = None) -> "Tensor":
        """A rank-0 tensor holding the size ``dim`` (a ``Dim``, an int, or inside a graph a symbolic
        dim), as ``dtype`` (int64 by default) on ``device``."""
        return _F().from_dim(dim, dtype=dtype, device=device)

    @classmethod
    def from_dlpack(cls, array: Any) -> "Tensor":
        """A realized tensor sharing memory with a DLPack array (numpy, torch, driver)."""
        if isinstance(array, Tensor):
            return array
        if isinstance(array, Buffer):
            return cls(storage=array)
        return cls(storage=Buffer.from_dlpack(array))

    @classmethod
    def from_tensor_value(cls, value: TensorValue) -> "Tensor":
        """The tensor computed by ``value``, a value of the compute graph (or of a traced graph)."""
        return cls(value=value)

    # -- realization ---------------------------------------------------------------
    @property
    def real(self) -> bool:
        """Whether the tensor is backed by memory."""
        return self._t is not None

    @property
    def realize(self) -> "Tensor":
        """Force the tensor to realize (returns the tensor)."""
        if self._t is None:
            self._data()
        return self

    def _data(self) -> torch.Tensor:
        if self._t is None:
            if self._symbolic:
                raise ValueError(
                    f"this tensor stands for a value of graph {self._value._graph.name!r} being traced "
                    f"({self._value.type}); its values exist only when the compiled model runs"
                )
            GRAPH._evaluate(self)
        return self._t

    @property
    def driver_tensor(self) -> Buffer:
        """The underlying memory; raises RuntimeError while the tensor is unrealized."""
        if self._t is None:
            raise RuntimeError("Tensor.driver_tensor: the tensor is unrealized; use `.realize` first")
        if self._storage is None:
            self._storage = Buffer._from_torch(self._t)
        return self._storage

    buffer = driver_tensor

    # -- metadata ------------------------------------------------------------------
    @property
    def type(self) -> TensorType:
        if self._t is not None:
            return _torch_type(self._t)
        t = self._value.type
        if not Shape.is_static(t.shape) and not self._symbolic:
            return _torch_type(self._data())
        return t

    @property
    def dtype(self) -> DType:
        if self._t is not None:
            return _dtype_of(self._t)
        return self._value.type.dtype

    @property
    def shape(self) -> Shape:
        if self._t is not None:
            return Shape(list(self._t.shape))
        return self.type.shape

    @property
    def rank(self) -> int:
        if self._t is not None:
            return self._t.dim()
        return len(self._value.type.shape)

    @property
    def device(self) -> driver.Device:
        if self._t is not None:
            return driver.device_from_torch(self._t.device)
        return self._value.type.device.to_device()

    def num_elements(self) -> int:
        return math.prod(int(d) for d in self.shape)

    # -- placement (an ordinary tensor lives whole on one device; see max.experimental.sharding)
    @property
    def sharding(self) -> Any:
        """The mesh layout of a distributed tensor; None for an ordinary one."""
        return None

    @property
    def placements(self) -> tuple:
        """The per-mesh-axis placements: ``(Replicated(),)`` for an ordinary tensor (one device, whole)."""
        from max.experimental.sharding import Replicated

        return (Replicated(),)

    @property
    def mesh(self) -> Any:
        """The device mesh: a one-device ``DeviceMesh.single(self.device)`` for an ordinary tensor."""
        from max.experimental.sharding import DeviceMesh

        return DeviceMesh.single(self.device)

    @property
    def local_shards(self) -> list["Tensor"]:
        """The per-device local tensors (the tensor itself for an ordinary one)."""
        return [self]

    # -- ops as methods --------------------------------------------------------------
    def to(self, device: Any) -> "Tensor":
        return _F().transfer_to(self, device)

    def cast(self, dtype: DType) -> "Tensor":
        return _F().cast(self, dtype)

    def reshape(self, shape: Any) -> "Tensor":
        return _F().reshape(self, _shape_arg(shape))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
        return _F().flatten(self, start_dim, end_dim)

    def broadcast_to(self, shape: Any) -> "Tensor":
        return _F().broadcast_to(self, _shape_arg(shape))

    def permute(self, dims: list[int]) -> "Tensor":
        return _F().permute(self, list(dims))

    def transpose(self, dim1: int, dim2: int) -> "Tensor":
        return _F().transpose(self, dim1, dim2)

    @property
    def T(self) -> "Tensor":
        """The last two dims swapped (the tensor itself below rank 2)."""
        if self.rank < 2:
            return self
        return _F().transpose(self, -1, -2)

    def squeeze(self, axis: int) -> "Tensor":
        return _F().squeeze(self, axis)

    def unsqueeze(self, axis: int) -> "Tensor":
        return _F().unsqueeze(self, axis)

    def split(self, split_size_or_sections: Any, axis: int = 0) -> list["Tensor"]:
        """Pieces along ``axis``: of ``split_size_or_sections`` elements each (the last may be
        smaller) for an int, else of the listed sizes (which must add up to the axis size)."""
        n = int(self.shape[axis])
        if isinstance(split_size_or_sections, (int, np.integer)) and not isinstance(split_size_or_sections, bool):
            size = int(split_size_or_sections)
            if size < 1:
                raise ValueError(f"Tensor.split: split size must be >= 1, got {size}")
            sizes = [size] * (n // size) + ([n % size] if n % size else [])
        else:
            sizes = [int(s) for s in split_size_or_sections]
        return list(_F().split(self, sizes, axis))

    def clip(self, min: Any = None, max: Any = None) -> "Tensor":  # noqa: A002
        """Values limited to ``[min, max]`` (either bound may be None)."""
        return _F().clamp(self, min, max)

    clamp = clip

    # reductions: over ``axis`` keeping the rank (MAX's reductions), or over every element
    # (a rank-0 result) with ``axis=None``
    def _reduce(self, name: str, axis: Any) -> "Tensor":
        F = _F()
        if axis is None:  # every element, as MAX 26.7 does: shape [1] (.item() reads it)
            flat = F.reshape(self, [-1]) if self.rank != 1 else self
            return getattr(F, name)(flat, axis=-1)
        return getattr(F, name)(self, axis=axis)

    def sum(self, axis: int | None = -1) -> "Tensor":
        return self._reduce("sum", axis)

    def mean(self, axis: int | None = -1) -> "Tensor":
        return self._reduce("mean", axis)

    def prod(self, axis: int | None = -1) -> "Tensor":
        return self._reduce("prod", axis)

    def max(self, axis: int | None = -1) -> "Tensor":
        """Maximum along ``axis`` (rank kept), or of every element with ``axis=None``."""
        return self._reduce("max", axis)

    def min(self, axis: int | None = -1) -> "Tensor":
        return self._reduce("min", axis)

    def argmax(self, axis: int | None = -1) -> "Tensor":
        """Index (int64) of the maximum along ``axis`` (rank kept; flat index with ``axis=None``)."""
        return self._reduce("argmax", axis)

    def argmin(self, axis: int | None = -1) -> "Tensor":
        return self._reduce("argmin", axis)

    def item(self) -> Any:
        """The single element as a Python number."""
        t = self._data()
        if t.numel() != 1:
            raise ValueError(f"calling `item` on a tensor with {t.numel()} items but expected only 1 "
                             f"(Tensor.item: shape {list(t.shape)})")  # MAX's Buffer.item text (B17.5)
        return t.item()

    # -- interop ---------------------------------------------------------------------
    def _numpy(self) -> np.ndarray:
        return self.driver_tensor.to_numpy() if self._t is not None else self.realize.driver_tensor.to_numpy()

    def to_numpy(self) -> np.ndarray:
        """A numpy copy/view of the values (realizes the tensor)."""
        self._data()
        return self._numpy()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.to_numpy()
        return a.astype(dtype) if dtype is not None else a

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._data().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self._data().__dlpack_device__()

    def _values_text(self) -> str:
        t = self._data().detach()
        if t.dtype in (torch.bfloat16, torch.float16) or t.dtype.is_floating_point and t.element_size() == 1:
            t = t.float()
        return values_text(t.cpu().numpy())

    def __repr__(self) -> str:
        """``Tensor(<values>, dtype=DType.X, device=Device(type=cpu,id=0))``: the values as
        ``max.driver.values_text`` prints them, in full; ``str`` is the same."""
        if self._symbolic:
            return f"Tensor(<traced {self._value.type}>)"
        return f"Tensor({self._values_text()}, dtype=DType.{self.dtype.name}, device={self.device!r})"

    __str__ = __repr__

    def _values(self) -> Iterator[Any]:
        """The elements as Python scalars, in flat (row-major) order."""
        t = self._data().detach()
        if t.dtype in (torch.bfloat16, torch.float16) or t.dtype.is_floating_point and t.element_size() == 1:
            t = t.float()
        yield from t.cpu().reshape(-1).tolist()

    def _sync_realize(self) -> None:
        """Realize the tensor now (blocking); returns None."""
        self._data()

    def __bool__(self) -> bool:
        t = self._data()
        if t.numel() != 1:
            raise ValueError(f"the truth value of a Tensor with {t.numel()} elements is ambiguous")
        return bool(t.item())

    def __int__(self) -> int:
        return int(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __index__(self) -> int:
        if self.dtype.is_float():
            raise TypeError("only integer tensors can be used as an index")
        return int(self.item())

    def __len__(self) -> int:
        if self.rank == 0:
            raise TypeError("len() of a rank-0 Tensor")
        return int(self.shape[0])

    def __iter__(self) -> Iterator["Tensor"]:
        for i in range(len(self)):
            yield self[i]

    __hash__ = object.__hash__

    # -- operators (each is the functional op of the same name) ----------------------
    def __add__(self, o: Any) -> "Tensor":
        return _add(self, o)

    def __radd__(self, o: Any) -> "Tensor":
        return _add(o, self)

    def __sub__(self, o: Any) -> "Tensor":
        return _sub(self, o)

    def __rsub__(self, o: Any) -> "Tensor":
        return _sub(o, self)

    def __mul__(self, o: Any) -> "Tensor":
        return _mul(self, o)

    def __rmul__(self, o: Any) -> "Tensor":
        return _mul(o, self)

    def __truediv__(self, o: Any) -> "Tensor":
        return _div(self, o)

    def __rtruediv__(self, o: Any) -> "Tensor":
        return _div(o, self)

    def __floordiv__(self, o: Any) -> "Tensor":
        return _F().floor_div(self, o)

    def __rfloordiv__(self, o: Any) -> "Tensor":
        return _F().floor_div(o, self)

    def __mod__(self, o: Any) -> "Tensor":
        return _F().mod(self, o)

    def __rmod__(self, o: Any) -> "Tensor":
        return _F().mod(o, self)

    def __divmod__(self, o: Any) -> tuple["Tensor", "Tensor"]:
        return self // o, self % o

    def __rdivmod__(self, o: Any) -> tuple["Tensor", "Tensor"]:
        return o // self, o % self

    def __pow__(self, o: Any) -> "Tensor":
        return _F().pow(self, o)

    def __rpow__(self, o: Any) -> "Tensor":
        return _F().pow(o, self)

    def __matmul__(self, o: Any) -> "Tensor":
        return _F().matmul(self, o)

    def __rmatmul__(self, o: Any) -> "Tensor":
        return _F().matmul(o, self)

    def __neg__(self) -> "Tensor":
        return _F().negate(self)

    def __pos__(self) -> "Tensor":
        return self

    def __abs__(self) -> "Tensor":
        return _F().abs(self)

    def __invert__(self) -> "Tensor":
        return _F().logical_not(self)

    def __and__(self, o: Any) -> "Tensor":
        return _F().logical_and(self, o)

    def __rand__(self, o: Any) -> "Tensor":
        return _F().logical_and(o, self)

    def __or__(self, o: Any) -> "Tensor":
        return _F().logical_or(self, o)

    def __ror__(self, o: Any) -> "Tensor":
        return _F().logical_or(o, self)

    def __xor__(self, o: Any) -> "Tensor":
        return _F().logical_xor(self, o)

    def __rxor__(self, o: Any) -> "Tensor":
        return _F().logical_xor(o, self)

    def __eq__(self, o: Any) -> "Tensor":  # type: ignore[override]
        return _F().equal(self, o)

    def __ne__(self, o: Any) -> "Tensor":  # type: ignore[override]
        return _F().not_equal(self, o)

    def __lt__(self, o: Any) -> "Tensor":
        return _F().greater(o, self)

    def __le__(self, o: Any) -> "Tensor":
        return _F().greater_equal(o, self)

    def __gt__(self, o: Any) -> "Tensor":
        return _F().greater(self, o)

    def __ge__(self, o: Any) -> "Tensor":
        return _F().greater_equal(self, o)

    def __getitem__(self, index: Any) -> "Tensor":
        return _F().slice_tensor(self, index)


def _shape_arg(shape: Any) -> Any:
    if isinstance(shape, (int, np.integer)):
        return [int(shape)]
    return list(shape)


def _like_type(like: Any, who: str) -> TensorType:
    if isinstance(like, TensorType):
        return like
    if isinstance(like, Tensor):
        return like.type
    raise TypeError(f"{who}: expected a Tensor or a TensorType, got {type(like).__name__} {like!r}")


def _all_bool(x: Any) -> bool:
    if isinstance(x, (bool, np.bool_)):
        return True
    if isinstance(x, (list, tuple)):
        return len(x) > 0 and all(_all_bool(e) for e in x)
    return False


def _as_lists(x: Any) -> Any:
    """Nested sequences (ranges, tuples, user sequences) as nested lists; numbers kept; an element that
    is itself a tensor or DLPack array (``[t0, t1]``, as numpy and torch allow) becomes its values."""
    if isinstance(x, (numbers.Number, np.generic)):
        return x
    if isinstance(x, Tensor):
        return x.to_numpy().tolist()
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x).tolist()
    if isinstance(x, (str, bytes)) or not isinstance(x, collections.abc.Sequence):
        raise TypeError(f"Tensor: cannot make a tensor element from {type(x).__name__} {x!r}")
    return [_as_lists(e) for e in x]


def _from_data(data: Any, dtype: DType | None, device: Any) -> Tensor:
    """A realized tensor from ``Tensor(data, dtype=..., device=...)``'s data."""
    if dtype is not None and not isinstance(dtype, DType):
        raise TypeError(f"Tensor: dtype must be a DType, got {type(dtype).__name__} {dtype!r}")
    if isinstance(data, Tensor) or isinstance(data, Buffer) or (
            hasattr(data, "__dlpack__") and not isinstance(data, (numbers.Number, np.generic))):
        t = Tensor.from_dlpack(data)  # shares memory; keeps the array's dtype unless asked
        if dtype is not None and t.dtype is not dtype:
            t = t.cast(dtype)
        if device is not None:
            dev = _resolve(None, device)[1]
            if t.device != dev:
                t = t.to(dev)
        return t
    if not isinstance(data, (numbers.Number, np.generic, list, tuple)):
        if isinstance(data, (str, bytes, dict)) or not isinstance(data, collections.abc.Sequence):
            raise TypeError(f"Tensor: data must be a number, a nested list or a DLPack array, got "
                            f"{type(data).__name__}")
        data = _as_lists(data)  # range(...), other sequences (nested too)
    elif isinstance(data, (list, tuple)):
        data = _as_lists(data)  # lists may nest ranges / other sequences
    if dtype is None and _all_bool(data):
        dtype = DType.bool
    dtype, dev = _resolve(dtype, device)
    return Tensor._constant(data, dtype=dtype, device=dev)


GRAPH = ComputeGraph()

_compute.Tensor = _replay.Tensor = _dispatch.Tensor = Tensor
_dispatch.GRAPH = GRAPH

# The hot arithmetic ops, bound by max.experimental.functional when it is imported
# (it imports this module, so it cannot be imported from here).
_add = _sub = _mul = _div = None  # type: ignore[assignment]
