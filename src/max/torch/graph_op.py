"""``max.torch.graph_op``: a MAX graph as a PyTorch custom op (destination-passing style).

``@graph_op`` turns ``fn(*TensorValue) -> Value | [Value] | None`` into a
``torch.library`` custom op ``libremax::<name>`` with the schema
``(Tensor(a0!) out0, ..., Tensor x, ...) -> ()``: the caller allocates the
outputs and passes them first; the op writes them in place.

* Eager: the real kernel maps the torch arguments to graph types (dtype,
  shape, device from the tensors; ``input_types`` may make dims symbolic),
  builds ``fn``'s graph once per signature, compiles it with an
  ``InferenceSession`` for the tensors' devices, runs it on the torch tensors
  (zero-copy) and copies each result into its output buffer.
* ``torch.compile``: the fake (meta) kernel checks the output buffers against
  the graph's result types (building, never compiling or running, the graph
  when the sizes are concrete) and returns nothing, so Dynamo and Inductor
  treat the op as an opaque mutating call (auto-functionalized) and run the
  real kernel at execution time.
* Compile cache: one entry per (dtypes, shapes, devices) of the inputs; with
  symbolic ``input_types`` a symbolic dim is not part of the key, so one
  compiled graph serves every size.  ``op.cache_info()`` reports hits and
  compiles; ``op.cache_clear()`` empties it.

Weights of ``max.nn`` modules called inside ``fn`` are bound from their
loaded values (``load_state_dict``) when a signature is first compiled.
Autograd is not supported (no backward formula is registered).
"""

from __future__ import annotations

import inspect
import threading
from collections import namedtuple
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from max.graph.type import TensorType
from max.torch._common import (
    bind_to_type,
    check_output,
    device_ref,
    is_concrete,
    on_device,
    register_dps_op,
    session_for,
    tensor_type,
)

__all__ = ["graph_op", "CacheInfo"]

CacheInfo = namedtuple("CacheInfo", ["hits", "misses", "builds", "currsize"])
CacheInfo.__doc__ = ("Compile-cache statistics of a graph_op: ``misses`` counts graph compilations, "
                     "``builds`` graph constructions (the fake kernel builds without compiling).")


class _Entry:
    __slots__ = ("graph", "in_types", "out_types", "registry", "model")

    def __init__(self, graph: Any, in_types: list, out_types: list, registry: dict) -> None:
        self.graph = graph
        self.in_types = in_types
        self.out_types = out_types
        self.registry = registry
        self.model: Any = None


class _GraphOp:
    """The state behind one ``graph_op``: signature, graph/compile cache, kernels."""

    def __init__(self, fn: Callable[..., Any], name: str | None, kernel_library: Any,
                 input_types: Sequence[TensorType] | None, output_types: Sequence[TensorType] | None,
                 num_outputs: int | None) -> None:
        if not callable(fn):
            raise TypeError(f"graph_op: expected a function, got {type(fn).__name__}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or "graph_op"
        if not isinstance(self.name, str):
            raise TypeError(f"graph_op: name must be a str, got {type(self.name).__name__}")
        self.input_types = _type_list(self.name, "input_types", input_types)
        self.output_types = _type_list(self.name, "output_types", output_types)
        if num_outputs is not None and (isinstance(num_outputs, bool) or not isinstance(num_outputs, int)
                                        or num_outputs < 0):
            raise ValueError(f"graph_op {self.name!r}: num_outputs must be a non-negative int, got {num_outputs!r}")
        if self.output_types is not None and num_outputs is not None and num_outputs != len(self.output_types):
            raise ValueError(f"graph_op {self.name!r}: num_outputs={num_outputs} but output_types has "
                             f"{len(self.output_types)} entries")
        self.num_outputs = len(self.output_types) if self.output_types is not None else (
            num_outputs if num_outputs is not None else 1)
        self.in_names = _input_names(self.name, fn, self.input_types)
        self.out_names = _output_names(self.num_outputs, self.in_names)
        self.extensions = _extensions(kernel_library)
        self.symbolic = self.input_types is not None and any(
            not all(hasattr(d, "dim") for d in t.shape) for t in self.input_types)
        self._cache: dict[tuple, _Entry] = {}
        self._lock = threading.RLock()
        self.hits = 0
        self.compiles = 0
        self.builds = 0
        self.label = f"graph_op {self.name!r}"

    # ------------------------------------------------------------------ signatures
    def _split(self, args: tuple) -> tuple[tuple, tuple]:
        n_out, n_in = self.num_outputs, len(self.in_names)
        if len(args) != n_out + n_in:
            raise TypeError(f"{self.label}: expected {n_out} output buffer(s) then {n_in} input(s) "
                            f"({', '.join(self.out_names + self.in_names)}), got {len(args)} arguments")
        return args[:n_out], args[n_out:]

    def _key(self, ins: Sequence[torch.Tensor]) -> tuple:
        if self.input_types is None:
            return tuple((t.dtype, tuple(t.shape), t.device) for t in ins)
        return tuple((t.dtype, t.device) for t in ins)

    def _graph_input_types(self, ins: Sequence[torch.Tensor]) -> list[TensorType]:
        if self.input_types is None:
            return [tensor_type(t, f"{self.label}: input {n!r}") for t, n in zip(ins, self.in_names)]
        return [on_device(typ, device_ref(t.device)) for typ, t in zip(self.input_types, ins)]

    def _bind(self, ins: Sequence[torch.Tensor], types: Sequence[TensorType]) -> dict[str, int]:
        env: dict[str, int] = {}
        if self.input_types is not None:
            for t, typ, n in zip(ins, types, self.in_names):
                bind_to_type(self.label, f"input {n!r}", t, typ, env)
        return env

    # ------------------------------------------------------------------ cache
    def _entry(self, ins: Sequence[torch.Tensor]) -> _Entry:
        key = self._key(ins)
        e = self._cache.get(key)
        if e is not None:
            return e
        with self._lock:
            e = self._cache.get(key)
            if e is None:
                e = self._cache[key] = self._build(self._graph_input_types(ins))
        return e

    def _build(self, in_types: list[TensorType]) -> _Entry:
        from max.graph import Graph

        layers: list[Any] = []

        def record(layer: Any, args: tuple, kwargs: dict, outputs: Any) -> None:
            layers.append(layer)

        hooks = _layer_hooks()
        if hooks is not None:
            hooks.append(record)
        try:
            with Graph(self.name, input_types=in_types, custom_extensions=self.extensions) as g:
                res = self.fn(*g.inputs)
                outs = _as_values(self.label, res)
                if len(outs) != self.num_outputs:
                    raise ValueError(
                        f"{self.label}: the function returned {len(outs)} value(s), but the op was declared with "
                        f"{self.num_outputs} output(s); pass num_outputs= or output_types= to graph_op")
                outs = [self._conform(i, v) for i, v in enumerate(outs)]
                g.output(*outs)
        finally:
            if hooks is not None and record in hooks:
                hooks.remove(record)
        out_types = list(g.output_types)
        for i, t in enumerate(out_types):
            if not isinstance(t, TensorType):
                raise TypeError(f"{self.label}: output {i} is a {type(t).__name__}; graph ops return tensors")
        self.builds += 1
        return _Entry(g, in_types, out_types, _weight_values(g, layers))

    def _conform(self, i: int, v: Any) -> Any:
        """A returned value made to match ``output_types[i]`` (dtype must agree; shapes are rebound)."""
        if self.output_types is None:
            return v
        from max.graph import ops
        from max.graph.value import TensorValue

        want = self.output_types[i]
        if not isinstance(v, TensorValue):
            return v
        if v.dtype != want.dtype:
            raise TypeError(f"{self.label}: output {i} ({self.out_names[i]!r}) has dtype {v.dtype}, "
                            f"output_types[{i}] says {want.dtype}")
        if len(v.shape) != len(want.shape):
            raise ValueError(f"{self.label}: output {i} ({self.out_names[i]!r}) has shape {list(map(str, v.shape))}, "
                             f"output_types[{i}] says {list(map(str, want.shape))}")
        if [str(d) for d in v.shape] != [str(d) for d in want.shape]:
            v = ops.rebind(v, want.shape, f"{self.label}: output {i} does not have the shape output_types declares")
        return v

    def _model(self, e: _Entry) -> Any:
        m = e.model
        if m is None:
            with self._lock:
                m = e.model
                if m is None:
                    devices = [t.device for t in e.in_types + e.out_types]
                    m = e.model = session_for(devices).load(e.graph, weights_registry=e.registry)
                    self.compiles += 1
                    return m
        self.hits += 1
        return m

    def _check_outputs(self, e: _Entry, outs: Sequence[torch.Tensor], env: dict) -> None:
        for o, typ, n in zip(outs, e.out_types, self.out_names):
            if not isinstance(o, torch.Tensor):
                raise TypeError(f"{self.label}: output buffer {n!r} must be a torch.Tensor, got {type(o).__name__}")
            check_output(self.label, repr(n), o, typ, env)

    # ------------------------------------------------------------------ kernels
    def impl(self, *args: Any) -> None:
        outs, ins = self._split(args)
        e = self._entry(ins)
        env = self._bind(ins, e.in_types)
        self._check_outputs(e, outs, env)
        model = self._model(e)
        results = model.execute(*[t if t.is_contiguous() else t.contiguous() for t in ins])
        for o, r, n in zip(outs, results, self.out_names):
            r = r._torch()
            if r.shape != o.shape:  # only dims unknowable before running (data-dependent) get here
                raise ValueError(f"{self.label}: output buffer {n!r}: the graph produced shape {list(r.shape)}, "
                                 f"the buffer has shape {list(o.shape)}")
            o.copy_(r)

    def fake(self, *args: Any) -> None:
        outs, ins = self._split(args)
        if all(is_concrete(t) for t in list(ins) + list(outs)):
            unset = _unset_fake()
            with unset:
                e = self._entry(ins)
                env = self._bind(ins, e.in_types)
                self._check_outputs(e, outs, env)
        return None

    def cache_info(self) -> CacheInfo:
        return CacheInfo(self.hits, self.compiles, self.builds, sum(e.model is not None for e in self._cache.values()))

    def cache_clear(self) -> None:
        with self._lock:
            self._cache.clear()
            self.hits = self.compiles = self.builds = 0


def graph_op(fn: Callable[..., Any] | None = None, name: str | None = None, kernel_library: Any = None,
             input_types: Sequence[TensorType] | None = None, output_types: Sequence[TensorType] | None = None,
             num_outputs: int | None = None) -> Any:
    """Make a PyTorch custom op from a function of MAX graph values (see the module docstring).

    The op is called as ``op(*outputs, *inputs)`` with torch tensors; outputs
    are modified in place and the op returns ``None``.  Without ``input_types``
    each new input shape compiles a specialised graph; symbolic dims in
    ``input_types`` let one compiled graph serve many sizes.  ``output_types``
    (or ``num_outputs``, default 1) fixes the number of outputs.  Tensor
    devices come from the arguments (a type's own device is replaced by its
    tensor's).  ``kernel_library`` (a path to a Python kernel module, a module
    or a ``KernelLibrary``) makes custom kernels available to ``ops.custom``.

    Returns the ``torch.library`` ``CustomOpDef``, with ``cache_info()`` and
    ``cache_clear()`` for its compile cache and ``max_graph_op`` for the state.
    """
    if fn is None:
        return lambda f: graph_op(f, name=name, kernel_library=kernel_library, input_types=input_types,
                                  output_types=output_types, num_outputs=num_outputs)
    state = _GraphOp(fn, name, kernel_library, input_types, output_types, num_outputs)

    def impl(*args: Any) -> None:
        state.impl(*args)

    def fake(*args: Any) -> None:
        return state.fake(*args)

    op = register_dps_op(state.name, state.out_names, state.in_names, impl, fake)
    op.max_graph_op = state
    op.cache_info = state.cache_info
    op.cache_clear = state.cache_clear
    try:
        op.__doc__ = getattr(fn, "__doc__", None) or op.__doc__
    except (AttributeError, TypeError):
        pass
    return op


# ----------------------------------------------------------------------------- helpers
def _type_list(name: str, what: str, types: Any) -> list[TensorType] | None:
    if types is None:
        return None
    if isinstance(types, TensorType):
        types = [types]
    out = list(types)
    for i, t in enumerate(out):
        if not isinstance(t, TensorType):
            raise TypeError(f"graph_op {name!r}: {what}[{i}] must be a TensorType, got {type(t).__name__} {t!r}")
    return out


def _input_names(name: str, fn: Callable, input_types: list | None) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var = any(p.kind is p.VAR_POSITIONAL for p in params)
    required = [p for p in positional if p.default is p.empty]
    if input_types is not None:
        n = len(input_types)
        if not var and not (len(required) <= n <= len(positional)):
            raise TypeError(f"graph_op {name!r}: input_types has {n} entries, but the function takes "
                            f"{len(required)}" + (f" to {len(positional)}" if len(positional) != len(required) else "")
                            + " positional argument(s)")
    elif var:
        raise TypeError(f"graph_op {name!r}: the function takes *args, so the number of inputs is unknown; "
                        "pass input_types=[...]")
    else:
        n = len(positional)
    names = [p.name for p in positional[:n]]
    names += [f"input{i}" for i in range(len(names), n)]
    reserved = {"self", "out", "__op"}
    if len(set(names)) != len(names) or any(not s.isidentifier() or s in reserved for s in names):
        names = [f"input{i}" for i in range(n)]
    return names


def _output_names(n: int, in_names: list[str]) -> list[str]:
    for prefix in ("out", "output", "_out"):
        names = [f"{prefix}{i}" for i in range(n)]
        if not set(names) & set(in_names):
            return names
    return [f"__out{i}" for i in range(n)]


def _extensions(kernel_library: Any) -> list:
    if kernel_library is None:
        return []
    from max.graph.kernel_library import KernelLibrary, load_extension

    if isinstance(kernel_library, KernelLibrary):
        return list(kernel_library.library_paths())
    libs = kernel_library if isinstance(kernel_library, (list, tuple)) else [kernel_library]
    for lib in libs:
        load_extension(lib)  # a .mojo/.mojopkg path raises the engine's MOJO_HELP error here
    return [lib for lib in libs if isinstance(lib, (str, Path))]


def _as_values(label: str, res: Any) -> list:
    from max.graph.value import Value

    if res is None:
        return []
    if isinstance(res, Value) or hasattr(res, "type"):
        return [res]
    if isinstance(res, Iterable) and not isinstance(res, (str, bytes)):
        return list(res)
    raise TypeError(f"{label}: the function must return graph values (or None), got {type(res).__name__}")


def _layer_hooks() -> list | None:
    try:
        from max.nn import layer
    except Exception:  # noqa: BLE001 - max.nn unavailable: no modules to collect weights from
        return None
    return layer._HOOKS


def _weight_values(graph: Any, layers: list) -> dict:
    """Values of the graph's weights, from the ``max.nn`` modules called while building it."""
    if not graph._weights:
        return {}
    by_id: dict[int, Any] = {}
    seen: set[int] = set()
    for layer in layers:
        if id(layer) in seen or not hasattr(layer, "_named_weights"):
            continue
        seen.add(id(layer))
        for _full, owner, attr, w in layer._named_weights():
            values = owner._mstate().values
            if attr in values:
                by_id[id(w)] = values[attr]
    out = {}
    for wname, (w, _v) in graph._weights.items():
        if id(w) in by_id:
            out[wname] = by_id[id(w)]
    return out


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


def _unset_fake() -> Any:
    try:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        return unset_fake_temporarily()
    except ImportError:  # pragma: no cover - older torch
        return _Null()
