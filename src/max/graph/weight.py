"""``Weight``: a named tensor whose data is supplied when the graph is loaded.

A Weight is created outside any graph and added to the current graph the
first time an op uses it (``Graph.add_weight``).  Its data comes from the
``weights_registry`` given to ``InferenceSession.load``, keyed by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from max.dtype import DType
from max.graph.shape import Shape
from max.graph.type import DeviceRef, TensorType, _as_device_ref
from max.graph.value import TensorValue


@dataclass(frozen=True)
class ShardingStrategy:
    """How a weight is split across devices: ``axis`` to split along (None = replicate)."""

    num_devices: int
    axis: int | None = 0

    @staticmethod
    def rowwise(num_devices: int) -> "ShardingStrategy":
        return ShardingStrategy(num_devices, 0)

    @staticmethod
    def columnwise(num_devices: int) -> "ShardingStrategy":
        return ShardingStrategy(num_devices, 1)

    @staticmethod
    def replicate(num_devices: int) -> "ShardingStrategy":
        return ShardingStrategy(num_devices, None)

    @property
    def is_replicate(self) -> bool:
        return self.axis is None


class Weight(TensorValue):
    """A named, lazily-added graph tensor: ``Weight(name, dtype, shape, device, quantization_encoding=None)``."""

    __slots__ = (
        "name",
        "_local_name",
        "quantization_encoding",
        "align",
        "_sharding_strategy",
        "shard_idx",
        "_original",
        "_shard_parent",
        "__weakref__",
    )

    def __new__(cls, *args: Any, **kwargs: Any) -> "Weight":
        return object.__new__(cls)

    def __init__(
        self,
        name: str,
        dtype: DType,
        shape: Any,
        device: DeviceRef | Any = None,
        quantization_encoding: Any = None,
        align: int | None = None,
        sharding_strategy: ShardingStrategy | None = None,
        shard_idx: int | None = None,
        _placeholder: bool = False,
        _has_alias: bool = False,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"Weight: name must be a non-empty str, got {name!r}")
        if not isinstance(dtype, DType):
            raise TypeError(f"Weight {name!r}: dtype must be a DType, got {type(dtype).__name__} {dtype!r}")
        t = TensorType(dtype, shape, _as_device_ref(device, f"Weight {name!r}"))
        self._type = t
        self._graph = None
        self._node = None
        self._index = 0
        self.name = name
        self._local_name = name  # the name it was created with (max.nn keys a module's weights by it)
        self.quantization_encoding = quantization_encoding
        self.align = align
        self._sharding_strategy = sharding_strategy
        self.shard_idx = shard_idx
        self._original = (dtype, t.shape)
        self._shard_parent = None

    # TensorValue reads _type; these mirror the reference's properties.
    @property
    def original_dtype_and_shape(self) -> tuple[DType, Shape]:
        return self._original

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        return self._sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, value: ShardingStrategy | None) -> None:
        if self._shard_parent is not None:
            raise ValueError(f"Weight {self.name!r} is a shard; it cannot be sharded again")
        self._sharding_strategy = value

    def shard(self, devices: Iterable[DeviceRef]) -> list["Weight"]:
        """Views of this weight, one per device, split by ``sharding_strategy``."""
        devs = list(devices)
        st = self._sharding_strategy
        if self._shard_parent is not None:
            raise ValueError(f"Weight {self.name!r} is already a shard; it cannot be sharded again")
        if st is None:
            raise ValueError(f"Weight {self.name!r}: set sharding_strategy before calling shard()")
        if len(devs) != st.num_devices:
            raise ValueError(
                f"Weight {self.name!r}: sharding strategy is for {st.num_devices} devices, got {len(devs)}"
            )
        out = []
        for i, dev in enumerate(devs):
            shape = list(self.shape)
            if st.axis is not None:
                d = shape[st.axis]
                n = int(d)
                if n % st.num_devices:
                    raise ValueError(
                        f"Weight {self.name!r}: dim {st.axis} of size {n} does not split evenly "
                        f"across {st.num_devices} devices"
                    )
                shape[st.axis] = n // st.num_devices
            w = Weight(
                f"{self.name}._shard{i}", self.dtype, shape, dev, self.quantization_encoding, self.align,
                shard_idx=i,
            )
            w._shard_parent = (self, i, st)
            out.append(w)
        return out

    def _spec(self) -> tuple:
        return (self.name, self.dtype, tuple(self.shape), self.device, self.quantization_encoding)

    def _bound(self) -> TensorValue:
        """The value of this weight in the current graph (adding it on first use)."""
        from max.graph.graph import Graph, NoGraphError

        try:
            g = Graph.current
        except NoGraphError:
            raise NoGraphError(
                f"Weight {self.name!r} was used with no graph being built; use it inside `with Graph(...)`"
            ) from None
        return g._root().add_weight(self)

    def __repr__(self) -> str:
        enc = f", quantization_encoding={self.quantization_encoding}" if self.quantization_encoding else ""
        return f"Weight({self.name!r}, {self.dtype}, {self.shape}, {self.device}{enc})"

    __hash__ = object.__hash__
