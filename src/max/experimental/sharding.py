"""Distributed tensors in one process: how a tensor is laid out across a ``DeviceMesh``.

Vocabulary (per mesh axis): ``Replicated()`` (every device has the whole
tensor), ``Sharded(axis)`` (devices hold consecutive slices along a tensor
axis; uneven sizes split like ``numpy.array_split``) and ``Partial(op)``
(devices hold partial results whose reduction is the value).  A
``PlacementMapping`` holds one placement per mesh axis (DTensor style), a
``NamedMapping`` one mesh-axis name (or None) per tensor dim (JAX
PartitionSpec style); they convert into each other (``ConversionError`` when
information would be lost).

``functional.transfer_to(tensor, mapping)`` distributes a tensor; the result
is a :class:`DistributedTensor` holding one local tensor per mesh device
(``local_shards``).  Functional ops on distributed tensors dispatch per op:

* elementwise ops on equally placed, equally shaped operands run shard by
  shard and keep the placements;
* ``matmul`` of a contraction-sharded pair (lhs ``Sharded(-1)``, rhs
  ``Sharded(-2)``) multiplies locally into a ``Partial(SUM)`` result, which is
  reduced to ``Replicated``; row-sharded lhs with a replicated rhs stays
  row-sharded;
* every other op first reshards its inputs to ``Replicated`` and runs once per
  device.

Each reshard (all-gather or reduction) goes through the active solver, set
with ``with mode(GreedyReshard(on_reshard=...)):``: ``"ignore"`` (the
default), ``"warn"`` (a ``ReshardWarning``) or ``"error"`` (a ``ReshardError``).
Devices of a mesh may repeat (a simulated mesh of several CPU slots).
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
import enum
import itertools
import warnings
from typing import Any, Iterator, Sequence

import numpy as np

from max import driver
from max.experimental._context import contextvar_context
from max.graph.dim import Dim, StaticDim

__all__ = [
    "ConversionError", "DeviceMapping", "DeviceMesh", "DistributedTensor", "GreedyReshard", "NamedMapping",
    "Partial", "Placement", "PlacementMapping", "ReduceOp", "Replicated", "ReshardError", "ReshardWarning",
    "Sharded", "Solver", "distribute", "mode",
]


class ConversionError(ValueError):
    """A sharding specification cannot be converted without losing information."""


class ReshardWarning(UserWarning):
    """A distributed op needed a reshard (all-gather or reduction)."""


class ReshardError(RuntimeError):
    """A reshard was needed while the solver forbids them (``on_reshard="error"``)."""


# ----------------------------------------------------------------------------- mesh
class DeviceMesh:
    """An N-dimensional logical grid of devices (row-major over ``devices``)."""

    def __init__(self, devices: Sequence[Any], mesh_shape: Sequence[int] | None = None,
                 axis_names: Sequence[str] | None = None) -> None:
        devs = tuple(devices)
        if not devs:
            raise ValueError("DeviceMesh: needs at least one device")
        for d in devs:
            if not isinstance(d, driver.Device):
                raise TypeError(f"DeviceMesh: devices must be driver.Device objects, got {type(d).__name__}")
        shape = tuple(int(s) for s in (mesh_shape if mesh_shape is not None else (len(devs),)))
        if int(np.prod(shape)) != len(devs) or any(s < 1 for s in shape):
            raise ValueError(f"DeviceMesh: mesh_shape {shape} does not hold {len(devs)} devices")
        names = tuple(axis_names) if axis_names is not None else tuple(f"axis{i}" for i in range(len(shape)))
        if len(names) != len(shape) or len(set(names)) != len(names):
            raise ValueError(f"DeviceMesh: axis_names {names} must be {len(shape)} distinct names")
        self.devices = devs
        self.mesh_shape = shape
        self.axis_names = names

    @property
    def ndim(self) -> int:
        return len(self.mesh_shape)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    size = num_devices

    def axis_index(self, axis: int | str) -> int:
        if isinstance(axis, str):
            if axis not in self.axis_names:
                raise ValueError(f"DeviceMesh: no axis named {axis!r} (axes: {self.axis_names})")
            return self.axis_names.index(axis)
        if not -self.ndim <= axis < self.ndim:
            raise IndexError(f"DeviceMesh: axis {axis} out of range for a {self.ndim}-D mesh")
        return axis % self.ndim

    def axis_size(self, axis: int | str) -> int:
        return self.mesh_shape[self.axis_index(axis)]

    def coords(self) -> Iterator[tuple[int, ...]]:
        """Mesh coordinates in device order (row-major)."""
        return itertools.product(*(range(s) for s in self.mesh_shape))

    @staticmethod
    def single(device: Any) -> "DeviceMesh":
        """A one-device mesh on ``device`` (one axis named ``_`` of size 1)."""
        return DeviceMesh((device,), (1,), ("_",))

    @staticmethod
    def default() -> "DeviceMesh":
        """A single-device mesh on the default device (CPU)."""
        return DeviceMesh.single(driver.CPU())

    @property
    def is_single(self) -> bool:
        """True when the mesh holds exactly one device."""
        return len(self.devices) == 1

    @property
    def is_simulated(self) -> bool:
        """True when every mesh slot references the same device (collectives are emulated)."""
        first = self.devices[0]
        return all(d == first for d in self.devices)

    def device_coord(self, device_idx: int, axis: int | str) -> int:
        """``device_idx``'s coordinate along ``axis`` (row-major device order)."""
        if not 0 <= device_idx < len(self.devices):
            raise IndexError(f"DeviceMesh: device index {device_idx} out of range for {len(self.devices)} devices")
        a = self.axis_index(axis)
        stride = int(np.prod(self.mesh_shape[a + 1:], dtype=np.int64))
        return (device_idx // stride) % self.mesh_shape[a]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceMesh) and (self.devices, self.mesh_shape, self.axis_names) == (
            other.devices, other.mesh_shape, other.axis_names)

    def __hash__(self) -> int:
        return hash((self.mesh_shape, self.axis_names, tuple(str(d) for d in self.devices)))

    def __repr__(self) -> str:
        return "DeviceMesh(" + ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.mesh_shape)) + ")"


# ----------------------------------------------------------------------------- placements
class ReduceOp(enum.Enum):
    """How the partial values of a ``Partial`` placement combine."""

    SUM = "sum"
    MAX = "max"
    MIN = "min"
    PROD = "prod"


class Placement(abc.ABC):
    """What one mesh axis does to a tensor: ``Replicated``, ``Sharded`` or ``Partial``."""

    def local_dim(self, parent: Any, mesh: DeviceMesh, mesh_axis: int) -> list[Dim]:
        """The per-shard sizes of global dim ``parent`` along ``mesh_axis`` (unchanged by default)."""
        return [Dim(parent)] * mesh.mesh_shape[mesh_axis]

    def global_dim(self, cells: Sequence[Any]) -> Dim:
        """The global dim from the per-shard sizes (every shard holds it all by default)."""
        return Dim(cells[0])


class Replicated(Placement):
    """Every device on the mesh axis holds the same copy (a singleton)."""

    _instance: "Replicated | None" = None

    def __new__(cls) -> "Replicated":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "Replicated()"


class Sharded(Placement):
    """Every device on the mesh axis holds a slice of the tensor along ``axis``."""

    def __init__(self, axis: int, even: bool = True) -> None:
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise TypeError(f"Sharded: axis must be an int, got {axis!r}")
        self.axis = axis
        self.even = even

    def local_dim(self, parent: Any, mesh: DeviceMesh, mesh_axis: int) -> list[Dim]:
        d = Dim(parent)
        n = mesh.mesh_shape[mesh_axis]
        if not isinstance(d, StaticDim):
            raise ValueError(f"Sharded: cannot split symbolic dim {d} statically")
        q, r = divmod(d.dim, n)
        return [StaticDim(q + (1 if i < r else 0)) for i in range(n)]

    def global_dim(self, cells: Sequence[Any]) -> Dim:
        return StaticDim(sum(int(c) for c in cells))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sharded) and other.axis == self.axis

    def __hash__(self) -> int:
        return hash(("Sharded", self.axis))

    def __repr__(self) -> str:
        return f"Sharded({self.axis})"


class Partial(Placement):
    """Every device on the mesh axis holds a partial value; ``reduce_op`` combines them."""

    def __init__(self, reduce_op: ReduceOp = ReduceOp.SUM) -> None:
        self.reduce_op = ReduceOp(reduce_op)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Partial) and other.reduce_op is self.reduce_op

    def __hash__(self) -> int:
        return hash(("Partial", self.reduce_op))

    def __repr__(self) -> str:
        return f"Partial({self.reduce_op.name})"


# ----------------------------------------------------------------------------- mappings
class DeviceMapping(abc.ABC):
    """How a tensor maps onto a mesh."""

    @property
    @abc.abstractmethod
    def mesh(self) -> DeviceMesh: ...

    @abc.abstractmethod
    def to_placements(self) -> tuple[Placement, ...]: ...

    @property
    def is_fully_replicated(self) -> bool:
        return all(isinstance(p, Replicated) for p in self.to_placements())


class PlacementMapping(DeviceMapping):
    """Mesh-axis-indexed sharding: one placement per mesh axis."""

    def __init__(self, _mesh: DeviceMesh, _placements: Sequence[Placement]) -> None:
        pl = tuple(_placements)
        if not isinstance(_mesh, DeviceMesh):
            raise TypeError(f"PlacementMapping: mesh must be a DeviceMesh, got {type(_mesh).__name__}")
        if len(pl) != _mesh.ndim or not all(isinstance(p, Placement) for p in pl):
            raise ValueError(f"PlacementMapping: needs one Placement per mesh axis ({_mesh.ndim}), got {pl}")
        self._mesh = _mesh
        self.placements = pl

    @property
    def mesh(self) -> DeviceMesh:
        return self._mesh

    @property
    def is_fully_resolved(self) -> bool:
        return True

    def to_placements(self) -> tuple[Placement, ...]:
        return self.placements

    def to_named_sharding(self, tensor_rank: int) -> "NamedMapping":
        spec: list[Any] = [None] * tensor_rank
        for ax, p in enumerate(self.placements):
            if isinstance(p, Replicated):
                continue
            if not isinstance(p, Sharded):
                raise ConversionError(f"to_named_sharding: {p} has no tensor-dim form")
            dim = p.axis % tensor_rank
            name = self._mesh.axis_names[ax]
            spec[dim] = name if spec[dim] is None else (*((spec[dim],) if isinstance(spec[dim], str)
                                                           else spec[dim]), name)
        return NamedMapping(self._mesh, tuple(spec))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PlacementMapping) and other._mesh == self._mesh and other.placements == self.placements

    def __hash__(self) -> int:
        return hash((self._mesh, self.placements))

    def __repr__(self) -> str:
        return f"PlacementMapping({self.placements})"


class NamedMapping(DeviceMapping):
    """Tensor-dim-indexed sharding: per tensor dim, the mesh axis name(s) splitting it (or None)."""

    def __init__(self, mesh: DeviceMesh, spec: Sequence[Any]) -> None:
        self._mesh = mesh
        self.spec = tuple(spec)
        used: list[str] = []
        for s in self.spec:
            for name in (() if s is None else (s,) if isinstance(s, str) else tuple(s)):
                mesh.axis_index(name)
                if name in used:
                    raise ValueError(f"NamedMapping: mesh axis {name!r} shards more than one tensor dim")
                used.append(name)

    @property
    def mesh(self) -> DeviceMesh:
        return self._mesh

    def to_placements(self) -> tuple[Placement, ...]:
        out: list[Placement] = [Replicated()] * self._mesh.ndim
        for dim, s in enumerate(self.spec):
            for name in (() if s is None else (s,) if isinstance(s, str) else tuple(s)):
                out[self._mesh.axis_index(name)] = Sharded(dim)
        return tuple(out)

    def __repr__(self) -> str:
        return f"NamedMapping({self.spec})"


# ----------------------------------------------------------------------------- solver
class Solver:
    """Decides what happens when an op needs a reshard."""

    def __init__(self, on_reshard: str = "ignore") -> None:
        if on_reshard not in ("ignore", "warn", "error"):
            raise ValueError(f"{type(self).__name__}: on_reshard must be 'ignore', 'warn' or 'error', got {on_reshard!r}")
        self.on_reshard = on_reshard

    def reshard(self, what: str) -> None:
        if self.on_reshard == "warn":
            warnings.warn(f"reshard: {what}", ReshardWarning, stacklevel=4)
        elif self.on_reshard == "error":
            raise ReshardError(f"reshard needed: {what}")


class GreedyReshard(Solver):
    """Picks the first applicable per-op rule; reshards to replicated otherwise."""


_SOLVER: contextvars.ContextVar[Solver] = contextvars.ContextVar("max_sharding_solver", default=GreedyReshard())


def mode(solver: Solver) -> contextlib.AbstractContextManager:
    """Use ``solver`` for the distributed ops inside the ``with`` block."""
    if not isinstance(solver, Solver):
        raise TypeError(f"mode: expected a Solver, got {type(solver).__name__}")
    return contextvar_context(_SOLVER, solver)


# ----------------------------------------------------------------------------- distributed tensors
def _torch_reduce(parts: list, op: ReduceOp) -> Any:
    import torch

    stacked = torch.stack(parts)
    if op is ReduceOp.SUM:
        return stacked.sum(0)
    if op is ReduceOp.MAX:
        return stacked.amax(0)
    if op is ReduceOp.MIN:
        return stacked.amin(0)
    return stacked.prod(0)


def _identity(t: Any, op: ReduceOp) -> Any:
    import torch

    if op is ReduceOp.SUM:
        return torch.zeros_like(t)
    if op is ReduceOp.PROD:
        return torch.ones_like(t)
    return t.clone()


def _scatter_global(g: Any, mesh: DeviceMesh, placements: tuple) -> np.ndarray:
    """Per-device local torch tensors (object array shaped like the mesh) of global tensor ``g``."""
    cells = np.empty(mesh.mesh_shape, dtype=object)
    for coord in mesh.coords():
        t = g
        for ax, p in enumerate(placements):
            if isinstance(p, Sharded):
                axis = p.axis % t.dim()
                t = t.tensor_split(mesh.mesh_shape[ax], dim=axis)[coord[ax]]
            elif isinstance(p, Partial) and coord[ax] != 0:
                t = _identity(t, p.reduce_op)
        cells[coord] = t.contiguous()
    return cells


def _gather_global(cells: np.ndarray, placements: tuple) -> Any:
    """The global torch tensor from per-device locals (inverse of ``_scatter_global``)."""
    import torch

    def combine(sub: np.ndarray, ax: int) -> Any:
        if ax == len(placements):
            return sub[()]
        parts = [combine(sub[i], ax + 1) for i in range(sub.shape[0])]
        p = placements[ax]
        if isinstance(p, Sharded):
            return torch.cat(parts, dim=p.axis % parts[0].dim())
        if isinstance(p, Partial):
            return _torch_reduce(parts, p.reduce_op)
        return parts[0]

    return combine(cells, 0)


def _tensor_cls() -> Any:
    from max.experimental.tensor import Tensor

    return Tensor


class DistributedTensor(_tensor_cls()):  # type: ignore[misc]
    """A tensor laid out over a mesh: one local tensor per mesh device and a ``PlacementMapping``.

    Reading its values (``to_numpy``, ``item``, printing) assembles the global tensor.
    """

    __slots__ = ("_cells", "_mapping")

    def __init__(self, cells: np.ndarray, mapping: PlacementMapping) -> None:  # noqa: D107
        self._t = None
        self._value = None
        self._key = None
        self._storage = None
        self._cells = cells
        self._mapping = mapping

    # -- placement members
    @property
    def sharding(self) -> PlacementMapping:
        return self._mapping

    @property
    def placements(self) -> tuple[Placement, ...]:
        return self._mapping.placements

    @property
    def mesh(self) -> DeviceMesh:
        return self._mapping.mesh

    @property
    def local_shards(self) -> list:
        """The local tensors, in mesh device order."""
        T = _tensor_cls()
        return [T._new(self._cells[c]) for c in self.mesh.coords()]

    def full_tensor(self) -> Any:
        """The global tensor (gathered onto the mesh's first device)."""
        return _tensor_cls()._new(_gather_global(self._cells, self.placements))

    def redistribute(self, mapping: DeviceMapping) -> "DistributedTensor":
        """The same global tensor laid out by ``mapping`` (a reshard)."""
        return distribute(self.full_tensor(), mapping)

    # -- Tensor overrides: the global view
    def _data(self) -> Any:
        return _gather_global(self._cells, self.placements)

    @property
    def real(self) -> bool:
        return True

    @property
    def realize(self) -> "DistributedTensor":
        return self

    @property
    def driver_tensor(self) -> Any:
        return driver.Buffer._from_torch(self._data())

    def _numpy(self) -> np.ndarray:
        return self.driver_tensor.to_numpy()

    @property
    def type(self) -> Any:
        from max.experimental._compute import _torch_type

        t = _torch_type(self._cells[(0,) * self.mesh.ndim])
        return type(t)(t.dtype, self.shape, t.device)

    @property
    def dtype(self) -> Any:
        from max.experimental._compute import _dtype_of

        return _dtype_of(self._cells[(0,) * self.mesh.ndim])

    @property
    def shape(self) -> Any:
        from max.graph.shape import Shape

        placements = self.placements

        def combine(sub: np.ndarray, ax: int) -> list:
            if ax == len(placements):
                return list(sub[()].shape)
            parts = [combine(sub[i], ax + 1) for i in range(sub.shape[0])]
            p = placements[ax]
            if isinstance(p, Sharded):
                axis = p.axis % len(parts[0])
                out = list(parts[0])
                out[axis] = sum(q[axis] for q in parts)
                return out
            return parts[0]

        return Shape(combine(self._cells, 0))

    @property
    def rank(self) -> int:
        return self._cells[(0,) * self.mesh.ndim].dim()

    @property
    def device(self) -> Any:
        return self.mesh.devices[0]

    def __repr__(self) -> str:
        return f"DistributedTensor({self.placements}, shape={list(map(int, self.shape))}, dtype={self.dtype})"


def distribute(tensor: Any, mapping: DeviceMapping) -> DistributedTensor:
    """Lay ``tensor`` out over ``mapping``'s mesh (each device gets its local slice)."""
    if not isinstance(mapping, DeviceMapping):
        raise TypeError(f"distribute: expected a PlacementMapping or NamedMapping, got {type(mapping).__name__}")
    pm = mapping if isinstance(mapping, PlacementMapping) else PlacementMapping(mapping.mesh, mapping.to_placements())
    T = _tensor_cls()
    if isinstance(tensor, DistributedTensor):
        g = tensor._data()
    else:
        g = (tensor if isinstance(tensor, T) else T(tensor))._data()
    for p in pm.placements:
        if isinstance(p, Sharded) and not -g.dim() <= p.axis < g.dim():
            raise ValueError(f"distribute: Sharded({p.axis}) is out of range for a rank-{g.dim()} tensor")
    cells = _scatter_global(g, pm.mesh, pm.placements)
    for coord, dev in zip(pm.mesh.coords(), pm.mesh.devices):
        cells[coord] = cells[coord].to(dev._torch_device)
    return DistributedTensor(cells, pm)


# ----------------------------------------------------------------------------- op dispatch
_ELEMENTWISE = {
    "abs", "acos", "add", "atanh", "cast", "ceil", "cos", "div", "equal", "erf", "exp", "floor", "floor_div",
    "gelu", "greater", "greater_equal", "is_inf", "is_nan", "log", "log1p", "logical_and", "logical_not",
    "logical_or", "logical_xor", "max", "min", "mod", "mul", "negate", "not_equal", "pow", "relu", "round",
    "rsqrt", "sigmoid", "silu", "sin", "sqrt", "sub", "tanh", "trunc", "where",
}


def _is_dist(x: Any) -> bool:
    return isinstance(x, DistributedTensor)


def has_distributed(args: Any) -> bool:
    if _is_dist(args):
        return True
    if isinstance(args, (list, tuple)):
        return any(has_distributed(a) for a in args)
    if isinstance(args, dict):
        return any(has_distributed(v) for v in args.values())
    return False


def _flat(x: Any) -> list:
    if _is_dist(x):
        return [x]
    if isinstance(x, (list, tuple)):
        return [d for e in x for d in _flat(e)]
    if isinstance(x, dict):
        return [d for e in x.values() for d in _flat(e)]
    return []


def _local(x: Any, coord: tuple) -> Any:
    T = _tensor_cls()
    if _is_dist(x):
        return T._new(x._cells[coord])
    if isinstance(x, (list, tuple)):
        return type(x)(_local(e, coord) for e in x)
    if isinstance(x, dict):
        return {k: _local(v, coord) for k, v in x.items()}
    if isinstance(x, T) and not _is_dist(x):
        return x
    return x


def _assemble(results: dict, mesh: DeviceMesh, placements: tuple) -> Any:
    """Per-device results (coord -> result) back into distributed tensors."""
    T = _tensor_cls()
    first = results[(0,) * mesh.ndim]
    if isinstance(first, T):
        cells = np.empty(mesh.mesh_shape, dtype=object)
        for c, r in results.items():
            cells[c] = r._data()
        return DistributedTensor(cells, PlacementMapping(mesh, placements))
    if isinstance(first, (list, tuple)):
        return type(first)(_assemble({c: r[i] for c, r in results.items()}, mesh, placements)
                           for i in range(len(first)))
    return first


def _replicate_args(x: Any, why: str) -> Any:
    if _is_dist(x):
        if not x._mapping.is_fully_replicated:
            _SOLVER.get().reshard(f"{why}: {x.placements} -> replicated")
            return distribute(x.full_tensor(), PlacementMapping(x.mesh, (Replicated(),) * x.mesh.ndim))
        return x
    if isinstance(x, (list, tuple)):
        return type(x)(_replicate_args(e, why) for e in x)
    if isinstance(x, dict):
        return {k: _replicate_args(v, why) for k, v in x.items()}
    return x


def dispatch(fn: Any, name: str, args: tuple, kwargs: dict, rule: Any = None) -> Any:
    """Run functional op ``fn`` (named ``name``) on distributed tensor arguments (``rule``: the op's own
    placement rule, given to ``functional``; it returns the result's placements)."""
    dts = _flat((args, kwargs))
    mesh = dts[0].mesh
    for d in dts[1:]:
        if d.mesh != mesh:
            raise ValueError(f"{name}: distributed operands live on different meshes ({d.mesh} vs {mesh})")
    if rule is not None:
        placements = tuple(rule(*args, **kwargs))
        if len(placements) != mesh.ndim or not all(isinstance(p, Placement) for p in placements):
            raise ValueError(f"{name}: the sharding rule returned {placements!r}; expected one Placement per "
                             f"mesh axis ({mesh.ndim})")
        return _run_local(fn, args, kwargs, mesh, placements)
    T = _tensor_cls()
    plain = [a for a in list(args) + list(kwargs.values()) if isinstance(a, T) and not _is_dist(a)]
    if plain:
        raise ValueError(f"{name}: mixing distributed and ordinary tensors; distribute the ordinary one with "
                         "functional.transfer_to(x, mapping)")
    placements = dts[0].placements
    same = all(d.placements == placements and list(d.shape) == list(dts[0].shape) for d in dts)
    if name in _ELEMENTWISE and same and not any(isinstance(p, Partial) for p in placements):
        return _run_local(fn, args, kwargs, mesh, placements)
    if name == "matmul" and len(args) == 2 and all(_is_dist(a) for a in args) and mesh.ndim == 1:
        a, b = args
        pa, pb = a.placements[0], b.placements[0]
        if isinstance(pa, Sharded) and isinstance(pb, Sharded) and pa.axis % a.rank == a.rank - 1 \
                and pb.axis % b.rank == b.rank - 2 and b.rank >= 2:
            partial = _run_local(fn, args, kwargs, mesh, (Partial(ReduceOp.SUM),))
            _SOLVER.get().reshard(f"{name}: Partial(SUM) -> replicated (all-reduce)")
            return distribute(partial.full_tensor(), PlacementMapping(mesh, (Replicated(),)))
        if isinstance(pa, Sharded) and pa.axis % a.rank == 0 and a.rank >= 2 and isinstance(pb, Replicated):
            return _run_local(fn, args, kwargs, mesh, (pa,))
    rargs = _replicate_args(args, name)
    rkw = _replicate_args(kwargs, name)
    return _run_local(fn, rargs, rkw, mesh, (Replicated(),) * mesh.ndim)


def _run_local(fn: Any, args: Any, kwargs: dict, mesh: DeviceMesh, placements: tuple) -> Any:
    results = {c: fn(*_local(args, c), **_local(kwargs, c)) for c in mesh.coords()}
    return _assemble(results, mesh, placements)


from max.experimental import _dispatch as _dispatch_mod  # noqa: E402

_dispatch_mod._DISTRIBUTED = (has_distributed, dispatch)
