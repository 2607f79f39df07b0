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
* **Memoised replay**: an eager call whose arguments (tensor types, Python
  scalars, attributes) were seen before skips the type rule -- it already
  accepted exactly these types -- and replays the recorded kernels directly.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import weakref
from typing import Any, Callable, Iterator, TypeVar

import numpy as np
import torch

from max import driver
from max.driver import Buffer
from max.dtype import DType
from max.graph.graph import _ACTIVE, Graph, Node, _user_location
from max.graph.shape import Shape
from max.graph.type import DeviceRef, TensorType, _ChainType
from max.graph.value import TensorValue, Value, _make_value

__all__ = [
    "ComputeGraph",
    "Tensor",
    "contextvar_context",
    "default_device",
    "default_dtype",
    "defaults",
    "driver_tensor_type",
    "lazy",
    "GRAPH",
]

T = TypeVar("T")

# ----------------------------------------------------------------------------- defaults
_DEFAULT_DEVICE: contextvars.ContextVar[Any] = contextvars.ContextVar("max_experimental_device", default=None)
_DEFAULT_DTYPE: contextvars.ContextVar[Any] = contextvars.ContextVar("max_experimental_dtype", default=None)
_LAZY: contextvars.ContextVar[bool] = contextvars.ContextVar("max_experimental_lazy", default=False)


@contextlib.contextmanager
def contextvar_context(var: contextvars.ContextVar[T], value: T) -> Iterator[None]:
    """Set ``var`` to ``value`` for the duration of the ``with`` block."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def _as_device(device: Any, who: str) -> driver.Device:
    if isinstance(device, driver.Device):
        return device
    if isinstance(device, DeviceRef):
        return device.to_device()
    raise TypeError(f"{who}: device must be a driver.Device (CPU(), Accelerator()), got {type(device).__name__} {device!r}")


def default_device(device: Any) -> contextlib.AbstractContextManager:
    """Context manager: new tensors go to ``device`` unless told otherwise."""
    return contextvar_context(_DEFAULT_DEVICE, _as_device(device, "default_device"))


def default_dtype(dtype: DType) -> contextlib.AbstractContextManager:
    """Context manager: new tensors get ``dtype`` unless told otherwise."""
    if not isinstance(dtype, DType):
        raise TypeError(f"default_dtype: dtype must be a DType, got {type(dtype).__name__} {dtype!r}")
    return contextvar_context(_DEFAULT_DTYPE, dtype)


def lazy() -> contextlib.AbstractContextManager:
    """Context manager: ops stage into the compute graph instead of running now.

    Type rules still run at each call.  Tensors made inside realize when a
    value is needed (or with ``.realize``).
    """
    return contextvar_context(_LAZY, True)


def _accelerator_present() -> bool:
    return driver.accelerator_count() > 0


def defaults(dtype: DType | None = None, device: Any = None) -> tuple[DType, driver.Device]:
    """``(dtype, device)`` with every ``None`` replaced by the current default.

    The default device is the one set with :func:`default_device`, else an
    accelerator when one is present, else the CPU.  The default dtype is the
    one set with :func:`default_dtype`, else float32 on a CPU and bfloat16 on
    an accelerator.
    """
    if device is None:
        device = _DEFAULT_DEVICE.get()
        if device is None:
            device = driver.Accelerator() if _accelerator_present() else driver.CPU()
    else:
        device = _as_device(device, "defaults")
    if dtype is None:
        dtype = _DEFAULT_DTYPE.get()
        if dtype is None:
            dtype = DType.float32 if device.is_host else DType.bfloat16
    elif not isinstance(dtype, DType):
        raise TypeError(f"defaults: dtype must be a DType, got {type(dtype).__name__} {dtype!r}")
    return dtype, device


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


# Interned (dtype, shape, device) of realized tensors: the memo key of a tensor argument.
_TYPE_IDS: dict = {}


def _type_id(t: torch.Tensor) -> int:
    k = (t.dtype, t.shape, t.device)
    i = _TYPE_IDS.get(k)
    if i is None:
        i = _TYPE_IDS[k] = len(_TYPE_IDS)
    return i


# ----------------------------------------------------------------------------- the compute graph IR
class _ENode(Node):
    """A node of the compute graph; ``data`` holds its results once realized."""

    __slots__ = ("data",)


def _vdata(v: Value) -> Any:
    d = getattr(v._node, "data", None)
    return None if d is None else d[v._index]


def _np_to_torch(arr: np.ndarray) -> torch.Tensor:
    dt = DType.from_numpy(arr.dtype)
    if dt.is_float8() or dt is DType.bfloat16:
        arr = arr.view(np.uint8 if dt.size_in_bytes == 1 else np.uint16)
        return torch.from_numpy(np.array(arr)).view(dt.to_torch())
    return torch.from_numpy(np.array(arr))


class _ComputeIR(Graph):
    """The compute graph's ``Graph``: nodes whose inputs are realized run now.

    Eager nodes are executed by their kernel and never appended; lazy nodes
    are appended (``_nodes``) until :meth:`ComputeGraph.evaluate`.
    """

    def __init__(self, owner: "ComputeGraph") -> None:
        super().__init__("compute_graph")
        self._owner = weakref.ref(owner)
        self._rec: _Recorder | None = None
        self._env: dict = {}
        self._base_nodes = list(self._nodes)

    def _add_node(self, op: str, inputs: Any, result_types: Any, attrs: dict | None = None, *,
                  side_effects: bool = False, regions: tuple = (), loc: str | None = None) -> list:
        for v in inputs:
            if v._graph is not self:
                raise ValueError(
                    f"{op}: operand {v._short()} belongs to graph {v._graph.name!r}; graph values cannot be "
                    "mixed with eager tensors (use them inside that graph, or make tensors with Tensor.constant)"
                )
        if regions:
            raise NotImplementedError(f"{op}: ops with nested regions (cond, while_loop, call) only work inside a Graph")
        if op == "weight":
            raise TypeError(
                f"{(attrs or {}).get('name', op)!r}: weights and external constants need a Graph compiled with a "
                "weights_registry; for eager tensors use Tensor.constant / Tensor.from_dlpack"
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
        from max.engine.compiler.lower import _bind_dims, resolve_attrs_now
        from max.engine.kernels import KERNELS, load_builtin_kernels

        op = node.op
        types = [r._type for r in node.results]
        rec = self._rec
        if op == "constant":
            dev = types[0].device
            t = _np_to_torch(node.attrs["value"])
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
        try:
            kw = resolve_attrs_now(node.attrs, env)
        except KeyError as e:
            raise ValueError(f"{op}: symbolic dim {e} has no value in eager execution") from None
        try:
            r = spec.fn(*args, **kw)
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


_LITERALS = (int, float, bool, str, type(None), torch.dtype, torch.device)


def _replayable(v: Any) -> bool:
    """Kernel arguments a replay may pass again as they are (immutable literals)."""
    if isinstance(v, _LITERALS) or v is Ellipsis:
        return True
    if isinstance(v, (tuple, list)):
        return all(_replayable(e) for e in v)
    if isinstance(v, slice):
        return _replayable(v.start) and _replayable(v.stop) and _replayable(v.step)
    return False


# ----------------------------------------------------------------------------- memoised replay
class _Uncacheable(Exception):
    pass


class _Recorder:
    """Records the kernels one eager call ran, so an equal call can replay them."""

    __slots__ = ("ok", "refs", "n_args", "n_slots", "consts", "steps", "keep")

    def __init__(self, n_args: int) -> None:
        self.ok = True
        self.refs: dict[int, int] = {}  # id(value) -> slot
        self.n_args = n_args
        self.n_slots = n_args
        self.consts: dict[int, torch.Tensor] = {}
        self.steps: list[tuple] = []
        self.keep: list[Any] = []  # keep recorded values alive so their ids stay unique

    def arg(self, v: Value, i: int) -> None:
        prev = self.refs.get(id(v))
        if prev is not None and prev != i:
            self.ok = False
        self.refs[id(v)] = i
        self.keep.append(v)

    def constant(self, v: Value, t: torch.Tensor) -> None:
        s = self.n_slots
        self.n_slots += 1
        self.consts[s] = t
        self.refs[id(v)] = s
        self.keep.append(v)

    def step(self, fn: Callable, node: _ENode, inputs: tuple, kw: dict, tensor_idx: list, single: bool) -> None:
        ins = []
        for v in inputs:
            if isinstance(v._type, _ChainType):
                continue
            s = self.refs.get(id(v))
            if s is None:
                self.ok = False
                return
            ins.append(s)
        slots = []
        for i in tensor_idx:
            s = self.n_slots
            self.n_slots += 1
            self.refs[id(node.results[i])] = s
            slots.append(s)
        self.keep.append(node)
        self.steps.append((fn, tuple(ins), kw, slots[0] if single else tuple(slots)))

    def finish(self, res: Any, argts: list) -> "_Recipe | None":
        if not self.ok:
            return None
        try:
            template = self._template(res)
        except _Uncacheable:
            return None
        base: list[Any] = [None] * self.n_slots
        for s, t in self.consts.items():
            base[s] = t
        return _Recipe(base, self.n_args, tuple(self.steps), template)

    def _template(self, x: Any) -> Any:
        if isinstance(x, TensorValue):
            s = self.refs.get(id(x))
            if s is None:
                raise _Uncacheable
            if s < self.n_args:
                return ("a", s)
            return ("s", s)
        if isinstance(x, Value):
            raise _Uncacheable
        if type(x) in (list, tuple):
            return (type(x), tuple(self._template(e) for e in x))
        if x is None or isinstance(x, (int, float, str, bool)):
            return ("lit", x)
        raise _Uncacheable


class _Recipe:
    __slots__ = ("base", "n_args", "steps", "template", "run")

    def __init__(self, base: list, n_args: int, steps: tuple, template: Any) -> None:
        self.base = base
        self.n_args = n_args
        self.steps = steps
        self.template = template
        self.run = self._specialise()

    def _specialise(self) -> Callable[[list], Any]:
        base, steps, template, n_args = self.base, self.steps, self.template, self.n_args
        new = Tensor._new
        if len(steps) == 1 and template[0] == "s" and steps[0][3] == template[1]:
            fn, ins, kw, _ = steps[0]
            const = [base[j] for j in ins]
            if len(ins) == 2 and not kw:
                a, b = ins
                ca, cb = const
                if a < n_args and b < n_args:
                    return lambda ts: new(fn(ts[a]._t, ts[b]._t))
                if a < n_args:
                    return lambda ts: new(fn(ts[a]._t, cb))
                if b < n_args:
                    return lambda ts: new(fn(ca, ts[b]._t))
            if len(ins) == 1 and ins[0] < n_args:
                a = ins[0]
                if kw:
                    return lambda ts: new(fn(ts[a]._t, **kw))
                return lambda ts: new(fn(ts[a]._t))
        return self._run

    def _run(self, ts: list) -> Any:
        vals = self.base.copy()
        for i, t in enumerate(ts):
            vals[i] = t._t
        for fn, ins, kw, outs in self.steps:
            r = fn(*[vals[j] for j in ins], **kw)
            if type(outs) is int:
                vals[outs] = r
            else:
                for s, x in zip(outs, r):
                    vals[s] = x
        return _build(self.template, vals, ts)


def _build(tp: Any, vals: list, ts: list) -> Any:
    kind = tp[0]
    if kind == "s":
        return Tensor._new(vals[tp[1]])
    if kind == "a":
        return ts[tp[1]]
    if kind == "lit":
        return tp[1]
    return kind(_build(e, vals, ts) for e in tp[1])


_SCALAR_TYPES = (int, float, bool, str, type(None))


def _k(x: Any, ts: list) -> Any:
    """Memo key of one argument; appends tensors to ``ts`` in walk order."""
    tx = type(x)
    if tx is Tensor:
        if x._t is None:
            raise _Uncacheable
        for i, p in enumerate(ts):
            if p is x:
                ts.append(x)
                return ("dup", i)
        ts.append(x)
        k = x._key
        if k is None:
            k = x._key = _type_id(x._t)
        return k
    if tx is float:
        return (float, x.hex())
    if tx is int or tx is bool or tx is str or x is None or x is Ellipsis:
        return (tx, x)
    if tx is list or tx is tuple:
        return (tx, tuple([_k(e, ts) for e in x]))
    if tx is slice:
        return (slice, _k(x.start, ts), _k(x.stop, ts), _k(x.step, ts))
    if isinstance(x, (Value, np.ndarray, Buffer, torch.Tensor)):
        raise _Uncacheable
    if isinstance(x, np.generic):
        return (tx, x.tobytes())
    if isinstance(x, Shape):
        return (Shape, tuple(x))
    if isinstance(x, Tensor):
        raise _Uncacheable
    try:
        hash(x)
    except TypeError:
        raise _Uncacheable from None
    return (tx, x)


def _convert(x: Any, g: "_ComputeIR", rec: _Recorder | None, index: dict, argvals: dict) -> Any:
    """Tensors (also inside lists/tuples) -> their values in the compute graph."""
    tx = type(x)
    if tx is Tensor or isinstance(x, Tensor):
        v = x._graph_value(g)
        argvals[id(v)] = x
        if rec is not None:
            i = index.get(id(x))
            if i is None:
                rec.ok = False
            else:
                rec.arg(v, i)
        return v
    if tx is list or tx is tuple:
        return tx(_convert(e, g, rec, index, argvals) for e in x)
    return x


def _wrap(x: Any, g: "_ComputeIR", argvals: dict) -> Any:
    if isinstance(x, TensorValue) and x._graph is g:
        t = argvals.get(id(x))
        if t is not None:
            return t
        d = _vdata(x)
        if d is not None:
            return Tensor._realized(d, x)
        return Tensor(value=x)
    if type(x) in (list, tuple):
        return type(x)(_wrap(e, g, argvals) for e in x)
    return x


_MEMO_LIMIT = 4096


def functional(op: Callable[..., Any]) -> Callable[..., Any]:
    """Make graph op ``op`` accept eager :class:`Tensor` arguments.

    Inside a ``Graph`` (graph values as arguments) the wrapper simply calls
    ``op``.  Outside one, it calls ``op`` with the global compute graph as the
    current graph -- so its type rule runs at the call -- and returns
    :class:`Tensor` results, computed now (eager) or staged (lazy).
    """
    memo: dict = {}

    @functools.wraps(op)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _ACTIVE.get():
            return op(*args, **kwargs)
        ts: list = []
        key = None
        if not _LAZY.get():
            try:
                key = tuple([_k(a, ts) for a in args])
                if kwargs:
                    key = (key, tuple(sorted((n, _k(v, ts)) for n, v in kwargs.items())))
                recipe = memo.get(key)
            except _Uncacheable:
                key = None
                recipe = None
            if recipe is not None:
                return recipe.run(ts)
        return _call_slow(op, args, kwargs, ts, key, memo)

    wrapper.__wrapped_op__ = op  # type: ignore[attr-defined]
    wrapper._memo = memo  # type: ignore[attr-defined]
    return wrapper


def _call_slow(op: Callable, args: tuple, kwargs: dict, ts: list, key: Any, memo: dict) -> Any:
    g = GRAPH.graph
    rec = _Recorder(len(ts)) if key is not None else None
    index: dict[int, int] = {}
    if rec is not None:
        for i, t in enumerate(ts):
            index.setdefault(id(t), i)
    argvals: dict[int, Any] = {}
    token = _ACTIVE.set((g,))
    prev_rec, g._rec = g._rec, rec
    prev_env, g._env = g._env, {}
    try:
        cargs = [_convert(a, g, rec, index, argvals) for a in args]
        ckw = {n: _convert(v, g, rec, index, argvals) for n, v in kwargs.items()}
        res = op(*cargs, **ckw)
    finally:
        _ACTIVE.reset(token)
        g._rec = prev_rec
        g._env = prev_env
    out = _wrap(res, g, argvals)
    if rec is not None and rec.ok:
        recipe = rec.finish(res, ts)
        if recipe is not None:
            if len(memo) >= _MEMO_LIMIT:
                memo.clear()
            memo[key] = recipe
    return out


# ----------------------------------------------------------------------------- ComputeGraph
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
def _F():
    from max.experimental import functional as F

    return F


class Tensor:
    """A tensor with numerics that may be realized (backed by memory) or not.

    Illegal operations raise at the call.  Whether a tensor has been computed
    yet is not observable through its values: anything that reads them
    realizes it first.
    """

    __slots__ = ("_t", "_value", "_key", "_storage", "__weakref__")

    def __init__(self, *, storage: Any = None, value: Any = None) -> None:
        self._t = None
        self._value = None
        self._key = None
        self._storage = None
        if storage is None and value is None:
            raise TypeError(
                "Tensor: pass storage= (a driver Buffer) or value= (a TensorValue of the compute graph); "
                "use Tensor.constant / zeros / ones / full / arange / from_dlpack to make tensors"
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
                raise ValueError(
                    "Tensor: value must belong to the global compute graph (tensor.GRAPH.graph), "
                    f"not to graph {value._graph.name!r}"
                )
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
        """This tensor as a value of the graph being built (a constant outside the compute graph)."""
        active = _ACTIVE.get()
        g = active[-1] if active else GRAPH.graph
        if g is GRAPH.graph or isinstance(g, _ComputeIR):
            return self._graph_value(g)
        from max.graph import ops

        return ops.constant(self.to_numpy(), self.dtype, DeviceRef.from_device(self.device))

    # -- factories -----------------------------------------------------------------
    @classmethod
    def constant(cls, value: Any, *, dtype: DType | None = None, device: Any = None) -> "Tensor":
        """A tensor holding ``value`` (an array, a number or a nested sequence)."""
        dtype, device = defaults(dtype, device)
        return _F().constant(value, dtype, device)

    @classmethod
    def full(cls, shape: Any, value: Any, *, dtype: DType | None = None, device: Any = None) -> "Tensor":
        dtype, device = defaults(dtype, device)
        F = _F()
        return F.broadcast_to(F.constant(value, dtype, device), _shape_arg(shape))

    @classmethod
    def full_like(cls, type: TensorType, value: Any) -> "Tensor":
        if not isinstance(type, TensorType):
            raise TypeError(f"full_like: type must be a TensorType, got {type!r}")
        return cls.full(type.shape, value, dtype=type.dtype, device=type.device.to_device())

    @classmethod
    def zeros(cls, shape: Any, *, dtype: DType | None = None, device: Any = None) -> "Tensor":
        return cls.full(shape, 0, dtype=dtype, device=device)

    @classmethod
    def zeros_like(cls, type: TensorType) -> "Tensor":
        return cls.full_like(type, 0)

    @classmethod
    def ones(cls, shape: Any, *, dtype: DType | None = None, device: Any = None) -> "Tensor":
        return cls.full(shape, 1, dtype=dtype, device=device)

    @classmethod
    def ones_like(cls, type: TensorType) -> "Tensor":
        return cls.full_like(type, 1)

    @classmethod
    def arange(cls, start: Any = 0, stop: Any = None, step: Any = 1, *, dtype: DType | None = None,
               device: Any = None) -> "Tensor":
        """``start, start + step, ...`` below ``stop`` (``arange(n)`` counts from 0)."""
        if stop is None:
            start, stop = 0, start
        dtype, device = defaults(dtype, device)
        return _F().range(start, stop, step, dtype=dtype, device=device)

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
        """The tensor computed by ``value``, a value of the compute graph."""
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
            GRAPH._evaluate(self)
        return self

    def _data(self) -> torch.Tensor:
        if self._t is None:
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

    # -- metadata ------------------------------------------------------------------
    @property
    def type(self) -> TensorType:
        if self._t is not None:
            return _torch_type(self._t)
        t = self._value.type
        if not Shape.is_static(t.shape):
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

    def argmax(self, axis: int = -1) -> "Tensor":
        """Index of the maximum along ``axis`` (int64, rank kept)."""
        return _F().argmax(self, axis)

    def argmin(self, axis: int = -1) -> "Tensor":
        return _F().argmin(self, axis)

    def max(self, axis: int = -1) -> "Tensor":
        """Maximum along ``axis`` (rank kept)."""
        return _F().max(self, axis=axis)

    def min(self, axis: int = -1) -> "Tensor":
        return _F().min(self, axis=axis)

    def sum(self, axis: int = -1) -> "Tensor":
        return _F().sum(self, axis)

    def mean(self, axis: int = -1) -> "Tensor":
        return _F().mean(self, axis)

    def item(self) -> Any:
        """The single element as a Python number."""
        t = self._data()
        if t.numel() != 1:
            raise ValueError(f"Tensor.item: the tensor has {t.numel()} elements (shape {list(t.shape)}); item() needs exactly 1")
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

    def __repr__(self) -> str:
        t = self._data().detach()
        if t.dtype in (torch.bfloat16, torch.float16) or t.dtype.is_floating_point and t.element_size() == 1:
            t = t.float()
        arr = t.cpu().numpy()
        body = np.array2string(arr, separator=", ", prefix="Tensor(", threshold=200)
        return f"Tensor({body}, dtype={self.dtype}, device={self.device})"

    __str__ = __repr__

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
        return _F().floor(_div(self, o))

    def __rfloordiv__(self, o: Any) -> "Tensor":
        return _F().floor(_div(o, self))

    def __mod__(self, o: Any) -> "Tensor":
        return _F().mod(self, o)

    def __rmod__(self, o: Any) -> "Tensor":
        return _F().mod(o, self)

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
    if isinstance(shape, (list, tuple, Shape)):
        return list(shape)
    return list(shape)


GRAPH = ComputeGraph()

# The hot arithmetic ops, bound by max.experimental.functional when it is imported
# (it imports this module, so it cannot be imported from here).
_add = _sub = _mul = _div = None  # type: ignore[assignment]
