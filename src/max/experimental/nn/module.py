"""``Module``: a tree of child modules and tensor parameters with one ``forward``.

A module's *parameters* are its attributes holding :class:`Tensor`s, its
*children* the attributes holding modules (``ModuleList`` entries are named
``"0"``, ``"1"``, ...).  The qualified name of a parameter is the dotted path
to it (``"layers.0.weight"``).  Nothing is registered: the tree is read from
the attributes each time, so plain assignment is all a subclass does.

The same ``forward`` runs three ways:

* **eagerly** on :class:`Tensor` arguments (``module(x)``);
* **traced** inside ``with Graph(...)`` on graph values: the arguments are
  wrapped as tensors of that graph, parameters become constants, and the
  results come back as graph values;
* **compiled** with :meth:`Module.compile(*input_types) <Module.compile>`: the
  forward is traced into a Graph whose parameters are weights (named by their
  qualified names), compiled once, and returned as a :class:`CompiledModel`
  that runs on tensors.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from typing import Annotated, Any, Callable, Generic, Iterable, Iterator, Mapping, ParamSpec, TypeVar

import numpy as np

from max import driver
from max.dtype import DType
from max.experimental import _trace as trace_graph
from max.experimental.tensor import Tensor

__all__ = ["CompiledModel", "Module", "ModuleList", "PinnedDeviceTensor", "Sequential", "module_dataclass"]

_P = ParamSpec("_P")
_R = TypeVar("_R")
_M = TypeVar("_M", bound="Module")


class _DevicePinned:
    """Marker in ``PinnedDeviceTensor``: the field keeps its device when the module moves."""


# A Tensor field that ``Module.to`` leaves on its device (still a parameter).  Calling it builds a
# plain Tensor, as ``Tensor(...)`` does (``typing.Annotated`` forwards the call to its origin).
PinnedDeviceTensor = Annotated[Tensor, _DevicePinned]


def _is_pinned_annotation(ann: Any) -> bool:
    if isinstance(ann, str):
        return "PinnedDeviceTensor" in ann or "_DevicePinned" in ann
    return any(m is _DevicePinned or isinstance(m, _DevicePinned) for m in getattr(ann, "__metadata__", ()))


def _pinned_fields(cls: type) -> frozenset[str]:
    """Names of the attributes that ``cls`` (or a base class) annotates as ``PinnedDeviceTensor``."""
    cached = cls.__dict__.get("_pinned_fields_cache")
    if cached is not None:
        return cached
    names = set()
    for klass in reversed(cls.__mro__):
        for name, ann in vars(klass).get("__annotations__", {}).items():
            if _is_pinned_annotation(ann):
                names.add(name)
    out = frozenset(names)
    try:
        type.__setattr__(cls, "_pinned_fields_cache", out)
    except (TypeError, AttributeError):
        pass
    return out


def _move_unpinned(m: "Module", device: Any) -> None:
    pinned = _pinned_fields(type(m))
    for name, t in list(m.local_parameters):
        if name not in pinned:
            object.__setattr__(m, name, t.to(device))
    for _name, child in list(m.children):
        _move_unpinned(child, device)


class Module(Generic[_P, _R]):
    """The core unit of composition: child modules, tensor parameters and ``forward``."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.forward is not defined")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return trace_graph.call_module(self, args, kwargs)

    # ---------------------------------------------------------------- the tree
    @property
    def local_parameters(self) -> Iterator[tuple[str, Tensor]]:
        """``(name, tensor)`` for the tensors stored directly on this module."""
        for name, v in vars(self).items():
            if isinstance(v, Tensor) and not name.startswith("_"):
                yield name, v

    @property
    def children(self) -> Iterator[tuple[str, "Module"]]:
        """``(name, module)`` for the modules stored directly on this module."""
        for name, v in vars(self).items():
            if isinstance(v, Module) and not name.startswith("_"):
                yield name, v

    @property
    def descendants(self) -> Iterator[tuple[str, "Module"]]:
        """``(qualified name, module)`` for every module below this one (depth first)."""
        for name, child in self.children:
            yield name, child
            for sub, d in child.descendants:
                yield f"{name}.{sub}", d

    @property
    def parameters(self) -> Iterator[tuple[str, Tensor]]:
        """``(qualified name, tensor)`` for every parameter of this module and its descendants."""
        yield from self.local_parameters
        for name, child in self.children:
            for sub, t in child.parameters:
                yield f"{name}.{sub}", t

    @property
    def device(self) -> Any:
        """The device of the parameters (the default device when there are none)."""
        for _, t in self.parameters:
            return t.device
        from max.experimental._context import _resolve

        return _resolve(None, None)[1]

    # ---------------------------------------------------------------- loading parameters
    # (MAX 26.7's Module has no public apply_to_*/map_parameters/load_state/state_dict: use
    # ``dict(m.parameters)`` and ``load_state_dict``)
    def _apply_to_parameters(self, f: Callable[[str, Tensor], Tensor]) -> None:
        """Replace every parameter ``t`` by ``f(qualified_name, t)``, in place (children included)."""
        self._apply("", f)

    def _apply(self, prefix: str, f: Callable[[str, Tensor], Tensor]) -> None:
        for name, t in list(self.local_parameters):
            setattr(self, name, _as_tensor(f(prefix + name, t), prefix + name))
        for name, child in list(self.children):
            child._apply(f"{prefix}{name}.", f)

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True, *, auto_cast: bool = False) -> None:
        """Load parameters from ``state`` (qualified name -> Tensor or DLPack array).

        ``strict``: every parameter must have an entry and every entry a parameter
        (KeyError naming the names otherwise).  Shapes must match (ValueError); so must
        dtypes, unless ``auto_cast``, which casts each value to its parameter's dtype.
        """
        names = [n for n, _ in self.parameters]
        if strict:
            missing = [n for n in names if n not in state]
            extra = [k for k in state if k not in set(names)]
            if missing or extra:
                raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {extra}")

        def load(name: str, t: Tensor) -> Tensor:
            if name not in state:
                return t
            new = _as_tensor(state[name], name)
            if list(new.shape) != list(t.shape):
                raise ValueError(f"load_state_dict: {name!r} has shape {[int(d) for d in t.shape]}, the new value "
                                 f"{[int(d) for d in new.shape]}")
            if new.dtype is not t.dtype:
                if not auto_cast:
                    raise ValueError(f"load_state_dict: {name!r} has dtype {t.dtype}, the new value {new.dtype} "
                                     "(pass auto_cast=True to cast it)")
                new = new.cast(t.dtype)
            return new.to(t.device) if new.device != t.device else new

        self._apply_to_parameters(load)

    def to(self: _M, device: Any) -> _M:
        """Move every parameter to ``device`` (in place); returns the module.  Fields annotated
        ``PinnedDeviceTensor`` (in this module, its children and subclasses) stay where they are."""
        _move_unpinned(self, device)
        return self

    # ---------------------------------------------------------------- compile
    def trace(self, *input_types: Any) -> Any:
        """Trace ``forward`` against ``input_types`` into a ``Graph`` without compiling it: parameters
        become graph weights named by their qualified names (run it with
        ``InferenceSession().load(graph, weights_registry=dict(module.parameters))``)."""
        return trace_graph.trace_module(self, input_types)[0]

    def compile(self, *input_types: Any, weights: Mapping[str, Any] | None = None) -> "CompiledModel":
        """Trace ``forward`` against ``input_types`` into a Graph and compile it.

        Parameters become graph weights named by their qualified names, bound to the
        module's current values (or to ``weights``, a name -> array mapping).
        """
        return trace_graph.compile_module(self, input_types, weights)

    # ---------------------------------------------------------------- printing
    def __rich_repr__(self) -> Iterator[Any]:
        """The fields ``repr`` shows (``rich``'s protocol: ``(name, value)``, ``(name, value, default)``
        omitted when equal to the default, or a bare positional value): a dataclass module's fields in
        order; otherwise its public attributes holding modules, tensors or plain values."""
        if dataclasses.is_dataclass(self):
            for f in dataclasses.fields(self):
                if f.repr and not f.name.startswith("_"):
                    yield f.name, getattr(self, f.name)
            return
        for name, v in vars(self).items():
            if name.startswith("_"):
                continue
            if isinstance(v, (Module, Tensor, int, float, bool, str, DType)) or v is None:
                yield name, v

    def __repr__(self) -> str:
        """As MAX prints modules: ``rich.pretty.pretty_repr(module, max_width=80, indent_size=4)``, one
        line when it fits (``Sequential(Block(a=1), Block(a=2))``), else one field per line."""
        from rich.pretty import pretty_repr

        return pretty_repr(self, max_width=80, indent_size=4)


def _as_tensor(v: Any, name: str) -> Tensor:
    if isinstance(v, Tensor):
        return v
    if isinstance(v, (np.ndarray, driver.Buffer)) or hasattr(v, "__dlpack__"):
        return Tensor.from_dlpack(v)
    raise TypeError(f"parameter {name!r}: expected a Tensor or DLPack array, got {type(v).__name__}")


def module_dataclass(cls: type | None = None, /, **kwargs: Any) -> Any:
    """Make a class a dataclass suitable for a Module: fields holding tensors are its parameters,
    fields holding modules its children (``repr`` and ``eq`` stay the Module's)."""

    def wrap(c: type) -> type:
        kwargs.setdefault("repr", False)
        kwargs.setdefault("eq", False)
        dc = dataclasses.dataclass(c, **kwargs)
        if not issubclass(dc, Module):
            raise TypeError(f"module_dataclass: {c.__name__} must subclass max.experimental.nn.Module")
        return dc

    return wrap(cls) if cls is not None else wrap


class ModuleList(list, Module):
    """A list of modules; its children are named by index (``"0"``, ``"1"``, ...)."""

    def __init__(self, modules: Iterable[Module] = ()) -> None:
        super().__init__(modules)
        for i, m in enumerate(self):
            if not isinstance(m, Module):
                raise TypeError(f"{type(self).__name__}: entry {i} is a {type(m).__name__}, not a Module")

    @property
    def children(self) -> Iterator[tuple[str, Module]]:
        for i, m in enumerate(self):
            yield str(i), m
        yield from Module.children.fget(self)  # type: ignore[attr-defined]

    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other

    def __rich_repr__(self) -> Iterator[Any]:
        yield from self  # the entries, positionally

    def __repr__(self) -> str:
        return Module.__repr__(self)


class Sequential(ModuleList):
    """Modules applied in order: ``Sequential(a, b)(x) == b(a(x))``."""

    def __init__(self, *modules: Module) -> None:
        if len(modules) == 1 and not isinstance(modules[0], Module):
            modules = tuple(modules[0])
        super().__init__(modules)

    def forward(self, x: Any) -> Any:
        for m in self:
            x = m(x)
        return x


class CompiledModel:
    """A module compiled by :meth:`Module.compile`: call it with tensors (or DLPack arrays)."""

    def __init__(self, model: Any, graph: Any, structure: Any, module: Module) -> None:
        self._model = model
        self.graph = graph
        self._structure = structure
        self._module_type = type(module).__name__

    @property
    def input_types(self) -> list:
        return [t for t in self.graph._input_types]

    def __call__(self, *args: Any) -> Any:
        return trace_graph.run_compiled(self, args)

    def __repr__(self) -> str:
        ins = ", ".join(str(t) for t in self.input_types)
        return f"CompiledModel({self._module_type}, inputs=[{ins}])"
