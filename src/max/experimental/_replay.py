"""Memoised replay of eager ops: an eager call whose arguments (tensor types, Python scalars,
attributes) were seen before replays the kernels it recorded, skipping the type rule that
already accepted exactly these types."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from max.driver import Buffer
from max.graph.shape import Shape
from max.graph.type import _ChainType
from max.graph.value import TensorValue, Value

Tensor: Any = None  # max.experimental.tensor.Tensor, bound when that module is imported

# Interned (dtype, shape, device) of realized tensors: the memo key of a tensor argument.
_TYPE_IDS: dict = {}


def _type_id(t: torch.Tensor) -> int:
    k = (t.dtype, t.shape, t.device)
    i = _TYPE_IDS.get(k)
    if i is None:
        i = _TYPE_IDS[k] = len(_TYPE_IDS)
    return i

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

    def step(self, fn: Callable, node: Any, inputs: tuple, kw: dict, tensor_idx: list, single: bool) -> None:
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


