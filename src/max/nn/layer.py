"""Layer base classes: ``Module`` (current), ``Layer`` (deprecated), ``LayerList``.

A :class:`Module` tracks the attributes assigned to it that are graph
:class:`~max.graph.Weight`s or other modules, in assignment order.  The dotted
attribute path of a weight (``"mlp.up.weight"``) is its unique name: weights of
a sub-module are renamed to their path as soon as the sub-module is attached to
a parent, and :meth:`Module.state_dict` / :meth:`Module.load_state_dict` /
:meth:`Module.raw_state_dict` finalise the names of the root's own weights too.
Weight *values* live on the module that owns the weight and are what
``state_dict()`` hands to ``InferenceSession.load(weights_registry=...)``.

Every layer's ``__call__`` (including ones a subclass defines itself) runs the
hooks registered with :func:`add_layer_hook` once it returns.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, TensorValue, Type, Weight
from max.graph.graph import NoGraphError
from max.graph.weight import ShardingStrategy

__all__ = [
    "Layer",
    "LayerList",
    "Module",
    "Shardable",
    "add_layer_hook",
    "clear_hooks",
    "recursive_named_layers",
]

# --------------------------------------------------------------------- hooks
_HOOKS: list[Callable[..., Any]] = []
_ACTIVE = threading.local()


def add_layer_hook(fn: Callable[[Any, tuple, dict, Any], Any]) -> None:
    """Run ``fn(layer, args, kwargs, outputs)`` after every layer ``__call__``.

    A non-None return value replaces the layer's outputs.
    """
    if not callable(fn):
        raise TypeError(f"add_layer_hook: fn must be callable, got {type(fn).__name__}")
    _HOOKS.append(fn)


def clear_hooks() -> None:
    """Remove all hooks."""
    _HOOKS.clear()


def _hooked(call: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a ``__call__`` so hooks run once per layer call (not again for ``super().__call__``)."""
    if getattr(call, "_max_nn_hooked", False):
        return call

    @functools.wraps(call)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        active = getattr(_ACTIVE, "ids", None)
        if active is None:
            active = _ACTIVE.ids = set()
        key = id(self)
        if key in active:  # a super().__call__ of the same layer: hooks run in the outermost one
            return call(self, *args, **kwargs)
        active.add(key)
        try:
            outputs = call(self, *args, **kwargs)
        finally:
            active.discard(key)
        for hook in list(_HOOKS):
            new = hook(self, args, kwargs, outputs)
            if new is not None:
                outputs = new
        return outputs

    __call__._max_nn_hooked = True  # type: ignore[attr-defined]
    return __call__


class Layer:
    """Base class of every layer (deprecated since 25.2: derive from :class:`Module`).

    Subclasses' ``__call__`` methods run the registered layer hooks.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        call = cls.__dict__.get("__call__")
        if call is not None and callable(call):
            type.__setattr__(cls, "__call__", _hooked(call))


# --------------------------------------------------------------------- Module
class _State:
    __slots__ = ("sublayers", "weights", "keys", "shared", "values", "path")

    def __init__(self) -> None:
        self.sublayers: dict[str, Module] = {}
        self.weights: dict[str, Weight] = {}
        self.keys: dict[str, str] = {}  # attribute -> the weight's name within this module
        self.shared: dict[str, Weight] = {}
        self.values: dict[str, Any] = {}
        self.path: str | None = None  # dotted path from the outermost parent; None = a root


def _join(prefix: str | None, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


class Module(Layer):
    """Base class for model components with automatic weight tracking.

    Assign ``Weight``s and sub-modules as attributes; ``state_dict()`` and
    ``load_state_dict()`` then address them by dotted attribute path.  Define
    ``forward`` (``__call__`` calls it) or override ``__call__`` directly.
    ``super().__init__()`` is optional.
    """

    def __init__(self) -> None:
        self._mstate()

    # -- tracking ---------------------------------------------------------
    def _mstate(self) -> _State:
        try:
            return object.__getattribute__(self, "_max_nn_state")
        except AttributeError:
            st = _State()
            object.__setattr__(self, "_max_nn_state", st)
            return st

    def __setattr__(self, name: str, value: Any) -> None:
        st = self._mstate()
        if not name.startswith("_max_nn_"):
            st.sublayers.pop(name, None)
            st.weights.pop(name, None)
            st.keys.pop(name, None)
            st.shared.pop(name, None)
            st.values.pop(name, None)
            if isinstance(value, Module):
                st.sublayers[name] = value
                if st.path is not None:
                    _assign_paths(value, _child_path(self, st.path, name, value))
                elif getattr(value, "_max_nn_omit_attr_name", False):
                    _assign_paths(value, "")
                else:
                    _assign_paths(value, name)
            elif isinstance(value, Weight):
                st.weights[name] = value
                st.keys[name] = _local_key(st, name, value)
                if st.path is not None and value._shard_parent is None:
                    value.name = _join(st.path, st.keys[name])
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        st = self._mstate()
        for d in (st.sublayers, st.weights, st.keys, st.shared, st.values):
            d.pop(name, None)
        object.__delattr__(self, name)

    @property
    def layer_weights(self) -> dict[str, Weight]:
        """This module's own weights (not its sub-modules'), by attribute name."""
        return dict(self._mstate().weights)

    @property
    def sublayers(self) -> dict[str, "Module"]:
        """Direct sub-modules by attribute name."""
        return dict(self._mstate().sublayers)

    def set_shared_weight(self, name: str, weight: Weight) -> None:
        """Make ``weight`` (owned by another module) available as ``self.<name>``.

        A shared weight keeps its owner's name and is not listed again in this
        module's state dict.
        """
        if not isinstance(weight, Weight):
            raise TypeError(f"set_shared_weight({name!r}): expected a Weight, got {type(weight).__name__}")
        st = self._mstate()
        st.sublayers.pop(name, None)
        st.weights.pop(name, None)
        st.values.pop(name, None)
        st.shared[name] = weight
        object.__setattr__(self, name, weight)

    @property
    def _layer_name(self) -> str:
        path = self._mstate().path
        return f"{type(self).__name__} {path!r}" if path else type(self).__name__

    # -- state dicts --------------------------------------------------------
    def _named_weights(self) -> Iterator[tuple[str, "Module", str, Weight]]:
        """``(full name, owning module, attribute, weight)`` for each owned weight, first path wins."""
        seen: set[int] = set()
        for prefix, layer in recursive_named_layers(self):
            st = layer._mstate()
            for attr, w in st.weights.items():
                if id(w) in seen:
                    continue
                seen.add(id(w))
                yield _join(prefix, st.keys.get(attr, attr)), layer, attr, w

    def raw_state_dict(self) -> dict[str, Weight]:
        """All ``Weight`` objects in the model by dotted name relative to this module.

        The weights' own names are finalised to their full path from the
        outermost parent (the same as the keys when this module is the root).
        """
        out: dict[str, Weight] = {}
        base = self._mstate().path
        for full, _layer, _attr, w in self._named_weights():
            _finalize(w, _join(base, full))
            out[full] = w
        return out

    def state_dict(self, auto_initialize: bool = True) -> dict[str, Any]:
        """Weight values by name, as ``driver.Buffer`` s sharing the loaded data (as in MAX 26.7);
        never-loaded weights are zero-filled (or ValueError when not ``auto_initialize``)."""
        out: dict[str, Any] = {}
        base = self._mstate().path
        for full, layer, attr, w in self._named_weights():
            _finalize(w, _join(base, full))
            values = layer._mstate().values
            if attr not in values:
                if not auto_initialize:
                    raise ValueError(
                        f"state_dict: weight {full!r} ({w.dtype}, shape {list(w.shape)}) has no value; "
                        "load one with load_state_dict() or call state_dict(auto_initialize=True)"
                    )
                values[attr] = _zeros(w, full)
            out[full] = _as_buffer(values[attr])
        return out

    def load_state_dict(
        self,
        state_dict: Mapping[str, Any],
        *,
        override_quantization_encoding: bool = False,
        weight_alignment: int | None = None,
        strict: bool = True,
    ) -> None:
        """Set the values of all weights from ``state_dict`` (DLPack arrays, numpy arrays or ``WeightData``).

        Raises ValueError (when ``strict``) for missing weights or unused keys,
        and always for a value whose shape or dtype differs from its weight's
        (the message names the weight and both shapes/dtypes), or whose data
        is not aligned to ``weight_alignment`` (default: the dtype's alignment).
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"load_state_dict: state_dict must be a mapping of name -> array, got {type(state_dict).__name__}")
        if weight_alignment is not None and (not isinstance(weight_alignment, int) or weight_alignment <= 0):
            raise ValueError(f"load_state_dict: weight_alignment must be a positive int, got {weight_alignment!r}")
        named = list(self._named_weights())
        names = {full for full, *_ in named}
        if strict:
            missing = sorted(n for n in names if n not in state_dict)
            unused = sorted(k for k in state_dict if k not in names)
            problems = []
            if missing:
                problems.append(f"missing weights {missing}")
            if unused:
                problems.append(f"unused keys {unused}")
            if problems:
                raise ValueError(
                    f"load_state_dict: {' and '.join(problems)} (the model's weights are {sorted(names)}); "
                    "pass strict=False to tolerate this"
                )
        pending = []
        for full, layer, attr, w in named:
            if full not in state_dict:
                continue
            _finalize(w, _join(self._mstate().path, full))
            pending.append((layer, attr, w, _check_value(w, full, state_dict[full],
                                                          override_quantization_encoding, weight_alignment)))
        for layer, attr, w, (data, dtype, shape, encoding) in pending:
            if weight_alignment is not None:
                w.align = weight_alignment
            if override_quantization_encoding and (encoding != w.quantization_encoding or dtype != w.dtype
                                                   or shape != tuple(int(d) for d in w.shape)):
                w.quantization_encoding = encoding
                _retype(w, dtype, shape)
            layer._mstate().values[attr] = data

    # -- calling --------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}: define forward() (or __call__) to use this module")

    # -- subgraphs ------------------------------------------------------------
    def build_subgraph(self, name: str, input_types: Sequence[Type | list[Type]], weight_prefix: str = "") -> Graph:
        """Build this module as a subgraph of the current graph, callable with ``ops.call``.

        Each element of ``input_types`` is a Type, or a list of Types passed to
        the module as one list argument.  Weights whose names start with
        ``weight_prefix`` get the prefix removed inside the subgraph (they are
        placeholders): call the subgraph with ``ops.call(sub, ..., prefix=weight_prefix)``.
        """
        try:
            parent = Graph.current
        except NoGraphError:
            raise NoGraphError(
                f"{self._layer_name}.build_subgraph({name!r}): no graph is being built; "
                "call it inside `with Graph(...)`"
            ) from None
        groups: list[int | None] = []
        flat: list[Type] = []
        for i, t in enumerate(input_types):
            if isinstance(t, (list, tuple)):
                for j, tt in enumerate(t):
                    if not isinstance(tt, Type):
                        raise TypeError(f"build_subgraph({name!r}): input_types[{i}][{j}] is not a graph Type: {tt!r}")
                groups.append(len(t))
                flat.extend(t)
            else:
                if not isinstance(t, Type):
                    raise TypeError(f"build_subgraph({name!r}): input_types[{i}] is not a graph Type: {t!r}")
                groups.append(None)
                flat.append(t)

        weights = list(self.raw_state_dict().values())
        # Shared weights used by this module keep their owners' names; rename them too.
        for _, layer in recursive_named_layers(self):
            weights.extend(w for w in layer._mstate().shared.values() if all(w is not x for x in weights))
        renamed = []
        if weight_prefix:
            for w in weights:
                if w.name.startswith(weight_prefix):
                    renamed.append((w, w.name))
                    w.name = w.name[len(weight_prefix):]

        def fwd(*vals: Any) -> Any:
            args: list[Any] = []
            k = 0
            for g in groups:
                if g is None:
                    args.append(vals[k])
                    k += 1
                else:
                    args.append(list(vals[k:k + g]))
                    k += g
            return self(*args)

        try:
            sub = parent._root().add_subgraph(name, fwd, input_types=flat)
        finally:
            for w, old in renamed:
                w.name = old
        return sub

    def __repr__(self) -> str:
        st = self._mstate()
        parts = [f"{k}={type(v).__name__}" for k, v in st.sublayers.items()]
        parts += [f"{k}={w.dtype}{list(w.shape)}" for k, w in st.weights.items()]
        return f"{type(self).__name__}({', '.join(parts)})"


def _finalize(w: Weight, name: str) -> None:
    if w._shard_parent is None:
        w.name = name


def _local_key(st: _State, attr: str, w: Weight) -> str:
    """A weight's name within its module, as MAX names it: the name it was created with
    (``Linear(name="lin")`` owns ``lin.weight``, ``Embedding(name="emb")`` owns ``emb``), the
    attribute name for shards or when two weights of the module would share a name."""
    key = getattr(w, "_local_name", None) or attr
    if w._shard_parent is not None or any(k == key and a != attr for a, k in st.keys.items()):
        return attr
    return key


def _child_path(parent: Module, p: str, attr: str, sub: Module) -> str:
    """The path of child ``sub`` (attribute ``attr``); a module that omits its attribute name
    (unfused StackedLinear) passes its parent's path on to its children."""
    return p if getattr(sub, "_max_nn_omit_attr_name", False) else _join(p, attr)


def _assign_paths(module: Module, path: str) -> None:
    """Give ``module`` (and everything below it) its dotted path; rename owned weights accordingly."""
    seen: set[int] = set()

    def walk(m: Module, p: str) -> None:
        if id(m) in seen:
            return
        seen.add(id(m))
        st = m._mstate()
        st.path = p
        for attr, w in st.weights.items():
            if w._shard_parent is None:  # shards keep their parent-derived names
                w.name = _join(p, st.keys.get(attr, attr))
        for attr, sub in st.sublayers.items():
            walk(sub, _child_path(m, p, attr, sub))

    walk(module, path)


def recursive_named_layers(parent: Module, prefix: str = "") -> Iterable[tuple[str, Module]]:
    """``(dotted name, module)`` for ``parent`` (named ``prefix``) and all modules below it, depth first."""
    seen: set[int] = set()

    def walk(m: Module, p: str) -> Iterator[tuple[str, Module]]:
        if id(m) in seen:
            return
        seen.add(id(m))
        yield p, m
        for attr, sub in m._mstate().sublayers.items():
            yield from walk(sub, _child_path(m, p, attr, sub))

    yield from walk(parent, prefix)


# --------------------------------------------------------------------- values
def _zeros(w: Weight, name: str) -> np.ndarray:
    shape = []
    for d in w.shape:
        try:
            shape.append(int(d))
        except (TypeError, ValueError):
            raise ValueError(
                f"state_dict: weight {name!r} has symbolic shape {list(w.shape)}; it cannot be zero-initialised"
            ) from None
    return np.zeros(shape, dtype=w.dtype.to_numpy())


def _weight_data_type() -> type:
    from max.graph.weights import WeightData

    return WeightData


def _as_buffer(value: Any) -> Any:
    """A stored weight value as a ``driver.Buffer`` over the same memory where it can be (a
    ``WeightData``'s data; numpy, torch and other DLPack arrays)."""
    from max.driver import Buffer
    from max.graph.weights import WeightData

    if isinstance(value, WeightData):
        value = value.data
    if isinstance(value, Buffer):
        return value
    if isinstance(value, (np.ndarray, np.generic)):
        return Buffer.from_numpy(np.asarray(value))
    import torch

    if isinstance(value, torch.Tensor):
        return Buffer._from_torch(value.detach())
    if hasattr(value, "__dlpack__"):
        return Buffer._from_torch(torch.from_dlpack(value))
    return value


def _value_meta(value: Any, name: str) -> tuple[Any, DType, tuple[int, ...], Any, int | None]:
    """``(data, dtype, shape, encoding, data pointer)`` of a state-dict value."""
    from max.graph.weights import WeightData

    if isinstance(value, WeightData):
        data = value.data
        enc = value.quantization_encoding
        dtype = value.dtype
        shape = tuple(int(d) for d in value.shape)
        return data, dtype, shape, enc, _data_ptr(data)
    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        arr = np.asarray(value)
        return arr, DType.from_numpy(arr.dtype), tuple(arr.shape), None, arr.ctypes.data if arr.size else None
    try:
        import torch

        if isinstance(value, torch.Tensor):
            return value, DType.from_torch(value.dtype), tuple(value.shape), None, (
                value.data_ptr() if value.numel() else None)
    except ImportError:  # pragma: no cover
        pass
    dt = getattr(value, "dtype", None)
    shp = getattr(value, "shape", None)
    if isinstance(dt, DType) and shp is not None:  # driver.Buffer
        return value, dt, tuple(int(d) for d in shp), None, _data_ptr(value)
    if hasattr(value, "__dlpack__"):
        import torch

        t = torch.from_dlpack(value)
        return value, DType.from_torch(t.dtype), tuple(t.shape), None, (t.data_ptr() if t.numel() else None)
    raise TypeError(
        f"load_state_dict: value for weight {name!r} must be a numpy array, DLPack array, driver Buffer "
        f"or WeightData, got {type(value).__name__}"
    )


def _data_ptr(data: Any) -> int | None:
    try:
        import torch

        if isinstance(data, np.ndarray):
            return data.ctypes.data if data.size else None
        t = data if isinstance(data, torch.Tensor) else torch.from_dlpack(data)
        return t.data_ptr() if t.numel() else None
    except Exception:  # noqa: BLE001 - alignment is only checked where the pointer is known
        return None


def _check_value(w: Weight, name: str, value: Any, override: bool, alignment: int | None) -> tuple:
    data, dtype, shape, enc, ptr = _value_meta(value, name)
    if enc is None and not isinstance(value, _weight_data_type()):
        enc = w.quantization_encoding  # a raw array (a state_dict() Buffer) holds the weight's encoding
    if enc != w.quantization_encoding and not override:
        raise ValueError(
            f"load_state_dict: weight {name!r} has quantization encoding {w.quantization_encoding}, "
            f"the value has {enc}; pass override_quantization_encoding=True to adopt the value's encoding"
        )
    if not override or enc == w.quantization_encoding:
        want_shape = []
        for d in w.shape:
            try:
                want_shape.append(int(d))
            except (TypeError, ValueError):
                want_shape.append(d)  # symbolic: any size
        shown = [str(d) if not isinstance(d, int) else d for d in want_shape]
        if len(want_shape) != len(shape):
            raise ValueError(
                f"Value provided to weight {name!r} had different shape rank (expected={len(want_shape)}, "
                f"actual={len(shape)}). (load_state_dict: the value's shape is {list(shape)}, the weight's {shown})"
            )
        for i, (a, b) in enumerate(zip(want_shape, shape)):
            if isinstance(a, int) and a != b:
                raise ValueError(
                    f"Value provided to weight {name!r} had different shape (dim[{i}]: expected {a}, got {b}). "
                    f"(load_state_dict: the value's shape is {list(shape)}, the weight's {shown})"
                )
        if dtype != w.dtype:
            raise ValueError(
                f"load_state_dict: value for weight {name!r} has dtype {dtype}, but the weight's dtype is "
                f"{w.dtype}; convert it first (e.g. WeightData.astype or numpy .astype)"
            )
    align = alignment if alignment is not None else (w.align or dtype.align)
    if ptr is not None and align and ptr % align:
        raise ValueError(
            f"Found unaligned weight {name!r} (expected alignment={align})."
            "If the weights come from a safetensors file, its tensors start at offsets that are not multiples "
            "of their dtype's alignment: copy the array into an aligned one (np.ascontiguousarray of a copy), "
            f"or pass weight_alignment=1 to load_state_dict (data address {ptr:#x})."
        )
    return data, dtype, shape, enc


def _retype(w: Weight, dtype: DType, shape: tuple[int, ...]) -> None:
    t = TensorType(dtype, list(shape), w.device)
    object.__setattr__(w, "_type", t)


# --------------------------------------------------------------------- LayerList / Shardable
class LayerList(Module):
    """A list of layers whose weights are tracked under ``"0"``, ``"1"``, ..."""

    def __init__(self, layers: Sequence[Layer] = ()) -> None:
        super().__init__()
        object.__setattr__(self, "layers", [])
        for layer in layers:
            self.append(layer)

    def _resync(self) -> None:
        st = self._mstate()
        st.sublayers.clear()
        for i, layer in enumerate(self.layers):
            if isinstance(layer, Module):
                st.sublayers[str(i)] = layer
                _assign_paths(layer, _join(st.path, str(i)) if st.path is not None else str(i))

    def append(self, layer: Layer) -> None:
        self.layers.append(layer)
        self._resync()

    def extend(self, layer: Iterable[Layer]) -> None:  # the reference names the argument `layer`
        self.layers.extend(layer)
        self._resync()

    def insert(self, i: int, layer: Layer) -> None:
        self.layers.insert(i, layer)
        self._resync()

    def __getitem__(self, i: Any) -> Any:
        return self.layers[i]

    def __setitem__(self, i: int, layer: Layer) -> None:
        self.layers[i] = layer
        self._resync()

    def __delitem__(self, i: Any) -> None:
        del self.layers[i]
        self._resync()

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.layers)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("LayerList is not callable; use Sequential to chain layers")


@runtime_checkable
class Shardable(Protocol):
    """Something that can be split across devices (``Linear``, ``Weight``...)."""

    @property
    def sharding_strategy(self) -> ShardingStrategy | None: ...

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None: ...

    def shard(self, devices: Iterable[DeviceRef]) -> Sequence[Any]: ...


# --------------------------------------------------------------------- helpers for layers
def check_input(layer: Any, x: Any, *, rank: int | tuple[int, ...] | None = None, min_rank: int | None = None,
                dtype: DType | None = None, last_dim: Any = None, arg: str = "input") -> TensorValue:
    """Convert ``x`` to a TensorValue and check it for ``layer``; errors name the layer."""
    from max.graph.ops._common import as_tensor

    name = layer._layer_name if isinstance(layer, Module) else type(layer).__name__
    try:
        v = as_tensor(x, op=name, arg=arg)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{name}: {arg}: {e}") from None
    if rank is not None:
        ranks = (rank,) if isinstance(rank, int) else tuple(rank)
        if v.rank not in ranks:
            want = " or ".join(str(r) for r in ranks)
            raise ValueError(f"{name}: {arg} must have rank {want}, got rank {v.rank} ({v.type})")
    if min_rank is not None and v.rank < min_rank:
        raise ValueError(f"{name}: {arg} must have rank >= {min_rank}, got rank {v.rank} ({v.type})")
    if dtype is not None and v.dtype != dtype:
        raise TypeError(f"{name}: {arg} has dtype {v.dtype}, the layer's weights are {dtype}; cast it first")
    if last_dim is not None and v.rank >= 1:
        d = v.shape[-1]
        if str(d) != str(last_dim):
            raise ValueError(f"{name}: last dim of {arg} {v.type} is {d}, expected {last_dim}")
    return v


def on_device(v: TensorValue, device: DeviceRef | None) -> TensorValue:
    """``v`` moved to ``device`` when it lives elsewhere."""
    if device is None or v.device == device:
        return v
    return v.to(device)
