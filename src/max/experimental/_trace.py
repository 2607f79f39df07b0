"""Tracing modules into graphs: ``Module.__call__`` inside a ``Graph``, ``Module.compile`` and
running a ``CompiledModel``.

While a trace is active for a graph, tensors stand for values of that graph
(``Tensor(value=v)`` with no data) and every functional op called on them
stages a node there and gives back such tensors, so the same ``forward``
written against eager tensors builds the graph.  Realized tensors met on the
way (parameters, constants) become weights named by their qualified names
when compiling, constants otherwise.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from max import driver
from max.driver import Buffer
from max.experimental._context import _TRACE, contextvar_context
from max.graph.graph import _ACTIVE, Graph
from max.graph.type import DeviceRef, Type
from max.graph.value import TensorValue, Value

__all__ = ["call_module", "compile_module", "run_compiled", "trace_module"]


class _Trace:
    """One trace: the graph being built and how realized tensors bind into it."""

    def __init__(self, graph: Graph, params: Mapping[int, str] | None = None) -> None:
        self.graph = graph
        self.params = params or {}  # id(tensor) -> weight name (compile only)
        self.weights: dict[str, Any] = {}  # weight name -> Tensor bound to it
        self._bound: dict[int, Any] = {}

    def is_tracing(self, g: Graph) -> bool:
        return g is self.graph or g._root() is self.graph

    def owns(self, v: Value) -> bool:
        return v._graph is self.graph or v._graph._root() is self.graph

    def bind(self, t: Any, g: Graph) -> TensorValue | None:
        """The graph value of realized tensor ``t``: a weight for a module parameter."""
        name = self.params.get(id(t))
        if name is None:
            return None
        v = self._bound.get(id(t))
        if v is None:
            from max.graph.weight import Weight

            w = Weight(name, t.dtype, list(t.shape), DeviceRef.from_device(t.device))
            v = self.graph.add_weight(w)
            self._bound[id(t)] = v
            self.weights[name] = t
        return v

    def call(self, op: Any, args: tuple, kwargs: dict) -> Any:
        res = op(*[self._in(a) for a in args], **{k: self._in(v) for k, v in kwargs.items()})
        return self._out(res)

    def _in(self, x: Any) -> Any:
        from max.experimental.tensor import Tensor

        if isinstance(x, Tensor):
            return x.__tensorvalue__()
        if type(x) in (list, tuple):
            return type(x)(self._in(e) for e in x)
        return x

    def _out(self, x: Any) -> Any:
        from max.experimental.tensor import Tensor

        if isinstance(x, TensorValue) and self.owns(x):
            return Tensor(value=x)
        if type(x) in (list, tuple):
            return type(x)(self._out(e) for e in x)
        return x


def _unwrap(x: Any) -> Any:
    from max.experimental.tensor import Tensor

    if isinstance(x, Tensor):
        return x.__tensorvalue__()
    if type(x) in (list, tuple):
        return type(x)(_unwrap(e) for e in x)
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def call_module(module: Any, args: tuple, kwargs: dict) -> Any:
    """``module(*args)``: eager on tensors; inside a Graph, traced into it (results are values)."""
    active = _ACTIVE.get()
    if not active:
        return module.forward(*args, **kwargs)
    g = active[-1]
    from max.experimental._compute import _ComputeIR

    if isinstance(g, _ComputeIR):
        return module.forward(*args, **kwargs)
    trace = _TRACE.get()
    if trace is not None and trace.is_tracing(g):
        if _subgraph_key(module) is not None and g._root()._parent is None:
            return _call_as_subgraph(module, g._root(), trace, args, kwargs)
        return module.forward(*[trace._out(a) for a in args], **{k: trace._out(v) for k, v in kwargs.items()})
    trace = _Trace(g._root())
    with contextvar_context(_TRACE, trace):
        if _subgraph_key(module) is not None and g._root()._parent is None:
            return _unwrap(_call_as_subgraph(module, g._root(), trace, args, kwargs))
        out = module.forward(*[trace._out(a) for a in args], **{k: trace._out(v) for k, v in kwargs.items()})
        return _unwrap(out)


# ----------------------------------------------------------------------------- shared subgraphs
_SUBGRAPH_ATTR = "_max_as_subgraph"


def _subgraph_key(module: Any) -> Any:
    """The ``as_subgraph`` mark of ``module`` (its instance's, else its class's): None when unmarked,
    True for an unnamed one, else the name."""
    mark = vars(module).get(_SUBGRAPH_ATTR) if hasattr(module, "__dict__") else None
    if mark is None:
        mark = getattr(type(module), _SUBGRAPH_ATTR, None)
    return mark


def _param_slots(module: Any) -> list[tuple[Any, str, Any]]:
    """``(owner, attribute, tensor)`` for every tensor attribute in the module tree (owners are the
    modules that hold them, so they can be swapped for the subgraph's inputs)."""
    from max.experimental.nn.module import Module
    from max.experimental.tensor import Tensor

    out: list = []
    seen: set[int] = set()

    def walk(m: Any) -> None:
        if id(m) in seen:
            return
        seen.add(id(m))
        for k, v in vars(m).items():
            if k.startswith("_"):
                continue
            if isinstance(v, Tensor):
                out.append((m, k, v))
            elif isinstance(v, Module):
                walk(v)
        if isinstance(m, list):
            for c in m:
                if isinstance(c, Module):
                    walk(c)

    walk(module)
    return out


def _call_as_subgraph(module: Any, g: Graph, trace: "_Trace", args: tuple, kwargs: dict) -> Any:
    """Lower ``module(*args, **kwargs)`` into one ``ops.call`` of a subgraph of the root graph ``g``.

    Tensor arguments and the module's parameters flow in as call operands, so equal modules (same
    class, operand types and other arguments) share one subgraph body while each computes with
    its own weights; other arguments are baked into the body.  A name given to ``as_subgraph``
    is the sharing key itself.
    """
    from max.experimental.tensor import Tensor
    from max.graph import ops

    mark = _subgraph_key(module)
    names = sorted(kwargs)
    flat = list(args) + [kwargs[k] for k in names]
    is_t = [isinstance(a, (Tensor, TensorValue)) for a in flat]
    arg_vals = [trace._in(trace._out(a)) for a, t in zip(flat, is_t) if t]
    slots = _param_slots(module)
    param_vals = [trace._in(t) for _m, _k, t in slots]
    operand_types = [v.type for v in arg_vals + param_vals]
    statics = tuple(repr(a) for a, t in zip(flat, is_t) if not t)
    key = mark if isinstance(mark, str) else (type(module).__qualname__, tuple(map(str, operand_types)), statics,
                                              tuple(names), tuple(is_t))
    cache = g.__dict__.setdefault("_max_subgraph_cache", {})
    entry = cache.get(key)
    if entry is None:
        sub_name = mark if isinstance(mark, str) else f"{type(module).__name__}_{len(cache)}"
        sub = g.add_subgraph(sub_name, input_types=operand_types)
        with sub, contextvar_context(_TRACE, _Trace(sub)):
            ins = list(sub.inputs)[:len(operand_types)]
            it = iter(ins[:len(arg_vals)])
            call_flat = [Tensor(value=next(it)) if t else a for a, t in zip(flat, is_t)]
            saved = [(m, k, getattr(m, k)) for m, k, _t in slots]
            try:
                for (m, k, _t), v in zip(slots, ins[len(arg_vals):]):
                    object.__setattr__(m, k, Tensor(value=v))
                out = module.forward(*call_flat[:len(args)], **dict(zip(names, call_flat[len(args):])))
            finally:
                for m, k, old in saved:
                    object.__setattr__(m, k, old)
            single = not isinstance(out, (list, tuple))
            outs = [out] if single else list(out)
            sub.output(*[_unwrap(o) for o in outs])
        entry = cache[key] = (sub, single, type(out) if not single else None)
    sub, single, seq = entry
    res = ops.call(sub, *arg_vals, *param_vals)
    res = [trace._out(r) for r in res]
    return res[0] if single else seq(res)


def trace_module(module: Any, input_types: Sequence[Type], who: str = "trace") -> tuple[Graph, "_Trace", bool, Any]:
    """Trace ``module.forward`` against ``input_types`` into a new Graph (see ``Module.trace``):
    ``(graph, trace, single_output, output)``."""
    for i, t in enumerate(input_types):
        if not isinstance(t, Type):
            raise TypeError(f"{type(module).__name__}.{who}: input_types[{i}] must be a graph Type "
                            f"(e.g. TensorType(DType.float32, ['batch', 5], device)), got {type(t).__name__}")
    params = {id(t): name for name, t in module.parameters}
    graph = Graph(type(module).__name__, input_types=list(input_types))
    graph._random_seed = "global"  # random ops draw from the generators of max.experimental.random.seed
    trace = _Trace(graph, params)
    with graph, contextvar_context(_TRACE, trace):
        out = module.forward(*[trace._out(v) for v in graph.inputs])
        single = not isinstance(out, (list, tuple))
        outs = [out] if single else list(out)
        graph.output(*[_unwrap(o) for o in outs])
    return graph, trace, single, out


def compile_module(module: Any, input_types: Sequence[Type], weights: Mapping[str, Any] | None) -> Any:
    """Trace ``module.forward`` against ``input_types`` and compile it (see ``Module.compile``)."""
    from max.engine import InferenceSession
    from max.experimental.nn.module import CompiledModel

    params = {id(t): name for name, t in module.parameters}
    graph, trace, single, out = trace_module(module, input_types, "compile")
    registry: dict[str, Any] = {}
    for name, t in trace.weights.items():
        src = weights[name] if weights is not None and name in weights else t
        registry[name] = _buffer_of(src, name)
    if weights is not None:
        unknown = sorted(set(weights) - set(params.values()))
        if unknown:
            raise KeyError(f"{type(module).__name__}.compile: weights has no parameter named {unknown}")
    devices = _devices_of(graph, registry)
    model = InferenceSession(devices=devices).load(graph, weights_registry=registry)
    return CompiledModel(model, graph, "single" if single else type(out), module)


def _buffer_of(x: Any, name: str) -> Buffer:
    from max.experimental.tensor import Tensor

    if isinstance(x, Tensor):
        return x.realize.driver_tensor
    if isinstance(x, Buffer):
        return x
    if hasattr(x, "__dlpack__") or hasattr(x, "__array__"):
        return Buffer.from_dlpack(x)
    raise TypeError(f"weight {name!r}: expected a Tensor or DLPack array, got {type(x).__name__}")


def _devices_of(graph: Graph, registry: Mapping[str, Buffer]) -> list:
    gpus = set()
    for t in list(graph._input_types) + [w.device for w in graph.weights().values()]:
        dev = getattr(t, "device", t)
        if isinstance(dev, DeviceRef) and dev.is_gpu():
            gpus.add(dev.id)
    for b in registry.values():
        if not b.device.is_host:
            gpus.add(b.device.id)
    return [driver.CPU()] + [driver.Accelerator(i) for i in sorted(gpus)]


def run_compiled(cm: Any, args: tuple) -> Any:
    """Execute a CompiledModel on tensors / DLPack arrays; results are realized tensors."""
    from max.experimental.tensor import Tensor

    bufs = []
    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            bufs.append(a.realize.driver_tensor)
        elif isinstance(a, Buffer):
            bufs.append(a)
        elif hasattr(a, "__dlpack__") or hasattr(a, "__array__"):
            bufs.append(Buffer.from_dlpack(a))
        else:
            bufs.append(a)
    outs = [Tensor(storage=b) if isinstance(b, Buffer) else b for b in cm._model.execute(*bufs)]
    if cm._structure == "single":
        return outs[0]
    return cm._structure(outs)
