"""Graph value types: tensors, buffers, chains, and the devices they live on."""

from __future__ import annotations

import enum
from typing import Any

from max.dtype import DType
from max.graph.dim import Dim, StaticDim
from max.graph.shape import Shape, ShapeLike


class DeviceKind(str, enum.Enum):
    """A device type."""

    CPU = "cpu"
    GPU = "gpu"

    def __str__(self) -> str:
        return self.value

    @staticmethod
    def from_string(txt: str) -> "DeviceKind":
        try:
            return DeviceKind(str(txt).lower())
        except ValueError:
            raise ValueError(f"DeviceKind: unknown device kind {txt!r}; expected 'cpu' or 'gpu'") from None


class DeviceRef:
    """A symbolic device: a kind and an id.  ``str(DeviceRef.GPU()) == "gpu:0"``."""

    __slots__ = ("device_type", "id")

    def __deepcopy__(self, memo: dict) -> "Any":
        return self  # immutable

    def __copy__(self) -> "Any":
        return self

    def __init__(self, device_type: DeviceKind | str, id: int = 0) -> None:
        kind = device_type if isinstance(device_type, DeviceKind) else DeviceKind.from_string(device_type)
        if isinstance(id, bool) or not isinstance(id, int):
            raise TypeError(f"DeviceRef: id must be an int, got {type(id).__name__} {id!r}")
        if id < 0:
            id = 0
        object.__setattr__(self, "device_type", kind)
        object.__setattr__(self, "id", id)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("DeviceRef is immutable")

    @staticmethod
    def CPU(id: int = 0) -> "DeviceRef":
        return DeviceRef(DeviceKind.CPU, id)

    @staticmethod
    def GPU(id: int = 0) -> "DeviceRef":
        return DeviceRef(DeviceKind.GPU, id)

    def is_cpu(self) -> bool:
        return self.device_type is DeviceKind.CPU

    def is_gpu(self) -> bool:
        return self.device_type is DeviceKind.GPU

    @staticmethod
    def from_device(device: Any) -> "DeviceRef":
        """A DeviceRef for a ``driver.Device`` (or a DeviceRef, returned as is)."""
        if isinstance(device, DeviceRef):
            return device
        label = getattr(device, "label", None)
        if label is None:
            raise TypeError(
                f"DeviceRef.from_device: expected a driver.Device or DeviceRef, got {type(device).__name__}"
            )
        return DeviceRef(DeviceKind.CPU if label == "cpu" else DeviceKind.GPU, 0 if label == "cpu" else device.id)

    def to_device(self) -> Any:
        """The ``driver.Device`` this ref names (raises if that accelerator does not exist)."""
        from max import driver

        if self.is_cpu():
            return driver.CPU()
        return driver.Accelerator(self.id)

    def to_mlir(self) -> str:
        return str(self)

    @staticmethod
    def from_mlir(attr: Any) -> "DeviceRef":
        kind, _, idx = str(attr).partition(":")
        return DeviceRef(DeviceKind.from_string(kind), int(idx or 0))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DeviceRef):
            return self.device_type is other.device_type and self.id == other.id
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.device_type.value, self.id))

    def __str__(self) -> str:
        return f"{self.device_type.value}:{self.id}"

    __repr__ = __str__  # MAX prints ``cpu:0`` for both


def _as_device_ref(device: Any, what: str = "device") -> DeviceRef:
    if device is None:
        return DeviceRef.CPU()
    if isinstance(device, DeviceRef):
        return device
    try:
        return DeviceRef.from_device(device)
    except TypeError:
        raise TypeError(f"{what}: expected a DeviceRef or driver.Device, got {type(device).__name__} {device!r}") from None


class ConvInputLayout(str, enum.Enum):
    NCHW = "NCHW"
    NHWC = "NHWC"

    def __str__(self) -> str:
        return self.value

    def to_mlir(self) -> str:
        return self.value

    @staticmethod
    def from_mlir(attr: Any) -> "ConvInputLayout":
        return ConvInputLayout(str(attr))


class FilterLayout(str, enum.Enum):
    CFRS = "CFRS"
    FCQRS = "FCQRS"
    FCRS = "FCRS"
    QRSCF = "QRSCF"
    RSCF = "RSCF"

    def __str__(self) -> str:
        return self.value

    def to_mlir(self) -> str:
        return self.value

    @staticmethod
    def from_mlir(attr: Any) -> "FilterLayout":
        return FilterLayout(str(attr))


class Type:
    """Base class of every graph value type."""

    __slots__ = ()

    def __deepcopy__(self, memo: dict) -> "Any":
        return self  # immutable

    def __copy__(self) -> "Any":
        return self

    def to_mlir(self) -> str:
        return str(self)

    @staticmethod
    def from_mlir(t: Any) -> "Type":
        if isinstance(t, Type):
            return t
        raise TypeError(f"Type.from_mlir: cannot convert {type(t).__name__}")


class _ShapedType(Type):
    __slots__ = ("dtype", "shape", "device", "_layout")
    _kind = "tensor"

    def __init__(
        self,
        dtype: DType,
        shape: ShapeLike,
        device: DeviceRef | Any = None,
        _layout: FilterLayout | None = None,
    ) -> None:
        cls = type(self).__name__
        if not isinstance(dtype, DType):
            raise TypeError(f"{cls}: dtype must be a DType, got {type(dtype).__name__} {dtype!r}")
        try:
            shp = shape if isinstance(shape, Shape) else Shape(shape)
        except TypeError as e:
            raise TypeError(f"{cls}: bad shape {shape!r}: {e}") from None
        for d in shp:
            if isinstance(d, StaticDim) and d.dim < 0:
                raise ValueError(f"{cls}: dims must be non-negative, got shape {shp}")
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "shape", shp)
        object.__setattr__(self, "device", _as_device_ref(device, cls))
        object.__setattr__(self, "_layout", _layout)

    def __setattr__(self, name: str, value: Any) -> None:
        """``dtype``, ``shape`` and ``device`` are assignable (checked as the constructor checks them).
        Graph values hold their own copies of their types, so editing a type never changes a graph."""
        if name not in ("dtype", "shape", "device"):
            raise AttributeError(f"{type(self).__name__} has no assignable field {name!r} (dtype, shape, device)")
        fields = {"dtype": self.dtype, "shape": self.shape, "device": self.device, name: value}
        checked = type(self)(fields["dtype"], fields["shape"], fields["device"], self._layout)
        object.__setattr__(self, name, getattr(checked, name))

    def _copy(self) -> "_ShapedType":
        """An independent copy (the shape list copied too)."""
        new = object.__new__(type(self))
        object.__setattr__(new, "dtype", self.dtype)
        object.__setattr__(new, "shape", Shape(self.shape))
        object.__setattr__(new, "device", self.device)
        object.__setattr__(new, "_layout", self._layout)
        return new

    @property
    def rank(self) -> int:
        return len(self.shape)

    def _key(self) -> tuple:
        return (type(self), self.dtype, tuple(self.shape), self.device)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _ShapedType):
            return self._key() == other._key()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._key())

    def to_mlir(self) -> str:
        """The compact form graph printouts use: ``tensor<float32, [batch, 4], cpu:0>``."""
        return f"{self._kind}<{self.dtype.name}, {self.shape._text()}, {self.device}>"

    def __repr__(self) -> str:
        # MAX's form, which appears inside its messages:
        # TensorType(dtype=float32, shape=[Dim(5), Dim(3)], device=cpu:0)
        return f"{type(self).__name__}(dtype={self.dtype!r}, shape={self.shape!r}, device={self.device!r})"

    __str__ = __repr__

    def num_elements(self) -> Dim:
        n: Dim = Dim(1)
        for d in self.shape:
            n = n * d
        return n


class TensorType(_ShapedType):
    """The type of a tensor value: dtype, shape and device.

    ``device`` defaults to the CPU when omitted (several reference examples omit it).
    """

    __slots__ = ()
    _kind = "tensor"

    def cast(self, dtype: DType) -> "TensorType":
        """The same shape and device with ``dtype``."""
        if not isinstance(dtype, DType):
            raise TypeError(f"TensorType.cast: dtype must be a DType, got {type(dtype).__name__} {dtype!r}")
        return TensorType(dtype, self.shape, self.device)

    def as_buffer(self) -> "BufferType":
        return BufferType(self.dtype, self.shape, self.device)


class BufferType(_ShapedType):
    """The type of a mutable buffer value."""

    __slots__ = ()
    _kind = "buffer"

    def as_tensor(self) -> TensorType:
        return TensorType(self.dtype, self.shape, self.device)


class _ChainType(Type):
    """The type of a chain value: orders side-effecting ops."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ChainType)

    def __hash__(self) -> int:
        return hash("!chain")

    def __str__(self) -> str:
        return "!chain"

    __repr__ = __str__
    to_mlir = __str__


class _OpaqueType(Type):
    """An opaque value named by a string (e.g. custom-op state)."""

    __slots__ = ("name", "parameters")

    def __init__(self, name: str, parameters: dict | None = None) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "parameters", dict(parameters or {}))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("_OpaqueType is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _OpaqueType) and (self.name, self.parameters) == (other.name, other.parameters)

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.parameters.items()))))

    def __str__(self) -> str:
        return f"opaque<{self.name}>"

    __repr__ = __str__
    to_mlir = __str__


ChainType = _ChainType
OpaqueType = _OpaqueType
