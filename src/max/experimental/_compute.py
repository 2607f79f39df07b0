"""The compute graph of eager tensors: ``ComputeGraph`` and its IR, where nodes whose inputs are
realized run at once (eager) and the others wait for ``ComputeGraph.evaluate`` (lazy)."""

from __future__ import annotations

import weakref
from typing import Any, Iterator

import torch

from max import driver
from max.driver import Buffer
from max.driver.buffer import numpy_to_torch
from max.dtype import DType
from max.experimental._context import _LAZY
from max.experimental._replay import _Recorder, _replayable
from max.graph.graph import Graph, Node, _user_location
from max.graph.shape import Shape
from max.graph.type import DeviceRef, TensorType, _ChainType
from max.graph.value import Value, _make_value

Tensor: Any = None  # max.experimental.tensor.Tensor, bound when that module is imported

def driver_tensor_type(t: Any) -> TensorType:
    """The graph ``TensorType`` describing a driver tensor (``Buffer``)."""
    if not isinstance(t, Buffer):
        raise TypeError(f"driver_tensor_type: expected a driver.Tensor/Buffer, got {type(t).__name__}")
    return TensorType(t.dtype, list(t.shape), DeviceRef.from_device(t.device))


def _torch_type(t: torch.Tensor) -> TensorType:
    return TensorType(_dtype_of(t), list(t.shape), _devref_of(t.device))


_TD2DT: dict = {}


def _dtype_of(t: torch.Tensor) -> DType:
    dt = _TD2DT.get(t.dtype)
    if dt is None:
        dt = _TD2DT[t.dtype] = DType.from_torch(t.dtype)
    return dt


def _devref_of(dev: torch.device) -> DeviceRef:
    return DeviceRef.CPU() if dev.type == "cpu" else DeviceRef.GPU(dev.index or 0)



# ----------------------------------------------------------------------------- the compute graph IR
class _ENode(Node):
    """A node of the compute graph; ``data`` holds its results once realized."""

    __slots__ = ("data",)


def _vdata(v: Value) -> Any:
    d = getattr(v._node, "data", None)
    return None if d is None else d[v._index]


class _ComputeIR(Graph):
    """The compute graph's ``Graph``: nodes whose inputs are realized run now.

    Eager nodes are executed by their kernel and never appended; lazy nodes
    are appended (``_nodes``) until :meth:`ComputeGraph.evaluate`.
    """

    def __init__(self, owner: "ComputeGraph") -> None:
        super().__init__("compute_graph")
        self._owner = weakref.ref(owner)
        self._random_seed = "global"  # seeded: random ops draw from max.experimental.random's generators
        self._eager_signals = True  # collectives take any tensor as a signal buffer (ops.distributed)
        self._rec: _Recorder | None = None
        self._env: dict = {}
        self._base_nodes = list(self._nodes)

    def _add_node(self, op: str, inputs: Any, result_types: Any, attrs: dict | None = None, *,
                  side_effects: bool = False, regions: tuple = (), loc: str | None = None) -> list:
        for v in inputs:
            if v._graph is not self:
                raise ValueError(
                    f"{op}: operand {v._short()} belongs to graph {v._graph.name!r}; graph values cannot be "
                    "mixed with eager tensors (use them inside that graph, or make tensors with Tensor(value, dtype=..., device=...))"
                )
        if regions:
            raise NotImplementedError(f"{op}: ops with nested regions (cond, while_loop, call) only work inside a Graph")
        if op == "weight":
            raise TypeError(
                f"{(attrs or {}).get('name', op)!r}: weights and external constants need a Graph compiled with a "
                "weights_registry; for eager tensors use Tensor(value, ...) / Tensor.from_dlpack"
            )
        node = _ENode(self, op, tuple(inputs), attrs or {}, loc or _user_location(), side_effects, regions)
        node.data = None
        node.results = tuple(_make_value(self, node, i, t) for i, t in enumerate(result_types))
        eager = not _LAZY.get()
        if eager:
            for v in node.inputs:
                if not isinstance(v._type, _ChainType) and _vdata(v) is None:
                    eager = False
                    break
        if eager:
            self._execute(node)
        else:
            owner = self._owner()
            for v in node.inputs:
                if not isinstance(v._type, _ChainType):
                    d = _vdata(v)
                    if d is not None and owner is not None:
                        owner.sources[v] = Tensor._realized(d, v)
            self._nodes.append(node)
            if self._rec is not None:
                self._rec.ok = False
        return list(node.results)

    def _execute(self, node: _ENode) -> None:
        from max.engine import backend
        from max.engine.compiler.lower import UnboundDimError, _bind_dims, call_kernel
        from max.engine.compiler.native_lowering import NATIVE_KERNELS, native_attrs
        from max.engine.kernels import KERNELS, load_builtin_kernels

        op = node.op
        types = [r._type for r in node.results]
        rec = self._rec
        if op == "constant":
            dev = types[0].device
            t = numpy_to_torch(node.attrs["value"], copy=True)
            if dev.is_gpu():
                t = t.to(torch.device("cuda", dev.id))
            node.data = (t,)
            if rec is not None:
                rec.constant(node.results[0], t)
            return
        spec = KERNELS.get(op)
        if spec is None:
            spec = load_builtin_kernels().get(op)
        if spec is None:
            raise NotImplementedError(f"{op}: no kernel for this op in the engine's kernel table")
        args = [_vdata(v) for v in node.inputs if not isinstance(v._type, _ChainType)]
        env = self._env
        env_before = len(env)
        attrs = node.attrs
        if op in NATIVE_KERNELS:  # the kernel variant the backend policy runs, as the native lowering writes it
            dev = next((t.device for t in types if isinstance(t, TensorType)), None)
            attrs = {**attrs, **native_attrs(op, dev, backend.current())}
        try:
            r, kw = call_kernel(spec, args, attrs, env)
        except UnboundDimError as e:
            raise ValueError(f"{op}: symbolic dim {e} has no value in eager execution") from None
        except Exception as e:  # point at the user's line
            e.add_note(f"while running {op} eagerly (called at {node.loc})")
            raise
        tensor_idx = [i for i, t in enumerate(types) if not isinstance(t, _ChainType)]
        multi = node.attrs.get("_multi", False)
        outs: list[Any] = [None] * len(types)
        if len(tensor_idx) == 1 and not multi:
            outs[tensor_idx[0]] = r
            single = True
        else:
            for k, i in enumerate(tensor_idx):
                outs[i] = r[k]
            single = False
        static = True
        for i in tensor_idx:
            shape = types[i].shape
            if not Shape.is_static(shape):
                static = False
            _bind_dims(env, outs[i], shape, f"{op} at {node.loc}")
        node.data = tuple(outs)
        inputs = node.inputs
        node.inputs = ()  # an eager node never runs again: drop its operands
        if rec is not None:
            if not static or len(env) != env_before or not all(_replayable(v) for v in kw.values()):
                rec.ok = False
            else:
                rec.step(spec.fn, node, inputs, kw, tensor_idx, single)



class _WeakTensorSet:
    """A ``WeakSet`` of tensors by identity (``Tensor.__eq__`` is elementwise,
    so ``weakref.WeakSet``, which compares referents with ``==``, cannot hold them)."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref] = {}

    def add(self, t: Any) -> None:
        k = id(t)
        refs = self._refs
        self._refs[k] = weakref.ref(t, lambda _r, k=k, refs=refs: refs.pop(k, None))

    def discard(self, t: Any) -> None:
        self._refs.pop(id(t), None)

    def remove(self, t: Any) -> None:
        if self._refs.pop(id(t), None) is None:
            raise KeyError(t)

    def clear(self) -> None:
        self._refs.clear()

    def __contains__(self, t: Any) -> bool:
        r = self._refs.get(id(t))
        return r is not None and r() is t

    def __iter__(self) -> Iterator[Any]:
        for r in list(self._refs.values()):
            t = r()
            if t is not None:
                yield t

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"<WeakSet of {len(self)} unrealized tensors>"


class ComputeGraph:
    """The graph of unrealized tensors (one global instance, :data:`GRAPH`).

    ``sources`` keeps the realized tensors that unrealized ones depend on;
    ``unrealized`` weakly tracks unrealized tensors.  :meth:`evaluate` prunes
    nodes no live tensor needs, compiles the rest and realizes every live
    unrealized tensor.
    """

    def __init__(self, context: Any = None, sources: Any = (), seed: int = 0) -> None:
        self.context = context
        self.seed = int(seed)
        self.graph: Graph = _ComputeIR(self)
        self.sources: dict[Value, Tensor] = {}
        self.unrealized = _WeakTensorSet()
        self._sessions: dict = {}
        for t in sources:
            self.add_source(t)

    def add_source(self, tensor: "Tensor") -> None:
        """Keep realized ``tensor`` available to computations in this graph."""
        if not isinstance(tensor, Tensor):
            raise TypeError(f"add_source: expected a Tensor, got {type(tensor).__name__}")
        if not tensor.real:
            raise ValueError("add_source: the tensor is unrealized; only realized tensors can be sources")
        v = tensor._graph_value(self.graph)
        self.sources[v] = tensor

    async def evaluate(self, tensor: "Tensor") -> None:
        """Realize ``tensor`` (and, today, every other live unrealized tensor)."""
        self._evaluate(tensor)

    def _evaluate(self, tensor: "Tensor | None" = None) -> None:
        live = [t for t in list(self.unrealized) if t._t is None]
        if tensor is not None and tensor._t is None and not any(t is tensor for t in live):
            live.append(tensor)
        if not live:
            return
        g = self.graph
        outs: list[Value] = []
        seen: set[int] = set()
        for t in live:
            v = t._value
            d = _vdata(v)
            if d is not None:
                t._t = d
                continue
            if id(v) not in seen:
                seen.add(id(v))
                outs.append(v)
        if outs:
            self._run(outs)
        for t in live:
            if t._t is None:
                t._t = _vdata(t._value)
            self.unrealized.discard(t)
        g._nodes = list(g._base_nodes)  # type: ignore[attr-defined]
        self.sources.clear()

    def _run(self, outs: list[Value]) -> None:
        from max.engine import InferenceSession

        need: set[int] = set()
        srcs: dict[int, Value] = {}
        stack = [v._node for v in outs]
        while stack:
            n = stack.pop()
            if id(n) in need:
                continue
            need.add(id(n))
            for v in n.inputs:
                if isinstance(v._type, _ChainType):
                    nn = v._node
                    if isinstance(nn, _ENode) and nn.data is None:
                        stack.append(nn)
                    continue
                if _vdata(v) is not None:
                    srcs.setdefault(id(v), v)
                else:
                    stack.append(v._node)
        order = [n for n in self.graph._nodes if id(n) in need]
        src_list = list(srcs.values())
        datas = [_vdata(v).contiguous() for v in src_list]
        cg = Graph("compute_graph", input_types=[_torch_type(d) for d in datas])
        m: dict[int, Value] = {id(v): cg.inputs[i] for i, v in enumerate(src_list)}
        for n in order:
            ins = []
            for v in n.inputs:
                x = m.get(id(v))
                if x is None:
                    if not isinstance(v._type, _ChainType):
                        raise RuntimeError(f"{n.op}: an operand was computed in an earlier evaluation and is gone")
                    x = cg._current_chain
                ins.append(x)
            res = cg._add_node(n.op, ins, [r._type for r in n.results], dict(n.attrs),
                               side_effects=n.side_effects, loc=n.loc)
            for r, nr in zip(n.results, res):
                m[id(r)] = nr
                if isinstance(r._type, _ChainType):
                    cg._current_chain = nr
        cg.output(*[m[id(v)] for v in outs])
        devs = {("cpu", 0)}
        for n in order:
            for r in n.results:
                dev = getattr(r._type, "device", None)
                if dev is not None and dev.is_gpu():
                    devs.add(("gpu", dev.id))
        for d in datas:
            if d.device.type != "cpu":
                devs.add(("gpu", d.device.index or 0))
        key = tuple(sorted(devs))
        sess = self._sessions.get(key)
        if sess is None:
            dl = [driver.CPU()] + [driver.Accelerator(i) for kind, i in key if kind == "gpu"]
            sess = self._sessions[key] = InferenceSession(devices=dl)
        model = sess.load(cg)
        results = model.execute(*[Buffer._from_torch(d) for d in datas])
        for v, buf in zip(outs, results):
            node = v._node
            data = list(node.data) if node.data is not None else [None] * len(node.results)
            data[v._index] = buf._torch()
            node.data = tuple(data)
        for n in order:
            if n.data is not None and all(
                d is not None or isinstance(r._type, _ChainType) for d, r in zip(n.data, n.results)
            ):
                n.inputs = ()


# ----------------------------------------------------------------------------- Tensor