"""``functional``: how a graph op runs on eager tensors (see ``max.experimental.tensor``)."""

from __future__ import annotations

import functools
from typing import Any, Callable

from max.experimental._compute import _ComputeIR, _vdata
from max.experimental._replay import _k, _Recorder, _Uncacheable
from max.experimental._context import _LAZY, _TRACE
from max.graph.graph import _ACTIVE
from max.graph.value import TensorValue

Tensor: Any = None  # max.experimental.tensor.Tensor, bound when that module is imported
GRAPH: Any = None  # max.experimental.tensor.GRAPH, bound likewise
_DISTRIBUTED: Any = None  # (has_distributed, dispatch) from max.experimental.sharding once imported

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


def functional(graph_op: Callable[..., Any], rule: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """Make graph op ``graph_op`` accept eager :class:`Tensor` arguments.

    ``rule`` (optional) is the op's sharding rule for distributed tensors: called with the
    call's arguments, it returns the result's placements (one per mesh axis); the op then runs
    on each device's local tensors and the results are assembled with those placements.
    Without it, the built-in rules of ``max.experimental.sharding`` apply.

    Inside a ``Graph`` (graph values as arguments) the wrapper simply calls
    ``op`` -- while a module is traced into that graph (``_trace``) its results
    come back as tensors of the graph.  Outside one, it calls ``op`` with the
    global compute graph as the current graph -- so its type rule runs at the
    call -- and returns :class:`Tensor` results, computed now (eager) or
    staged (lazy).
    """
    op = graph_op
    memo: dict = {}

    @functools.wraps(op)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _ACTIVE.get():
            trace = _TRACE.get()
            if trace is not None and trace.is_tracing(_ACTIVE.get()[-1]):
                return trace.call(op, args, kwargs)
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
        return _call_slow(op, args, kwargs, ts, key, memo, wrapper)

    wrapper.__wrapped_op__ = op  # type: ignore[attr-defined]
    wrapper.__sharding_rule__ = rule  # type: ignore[attr-defined]
    wrapper._memo = memo  # type: ignore[attr-defined]
    return wrapper


def _call_slow(op: Callable, args: tuple, kwargs: dict, ts: list, key: Any, memo: dict,
               wrapper: Callable) -> Any:
    if _DISTRIBUTED is not None and _DISTRIBUTED[0]((args, kwargs)):
        # distributed tensors: per-op placement rules, the op itself run on each device's locals
        return _DISTRIBUTED[1](wrapper, op.__name__, args, kwargs, getattr(wrapper, "__sharding_rule__", None))
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
