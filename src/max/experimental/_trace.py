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
        return module.forward(*[trace._out(a) for a in args], **{k: trace._out(v) for k, v in kwargs.items()})
    trace = _Trace(g._root())
    with contextvar_context(_TRACE, trace):
        out = module.forward(*[trace._out(a) for a in args], **{k: trace._out(v) for k, v in kwargs.items()})
        return _unwrap(out)


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
