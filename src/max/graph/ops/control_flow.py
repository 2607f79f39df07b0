"""Control flow: ``cond``, ``while_loop``, ``call`` (subgraphs) and ``fence``.

Branches and loop bodies are nested regions (blocks) built by calling the
user's callables inside them; a block may use values of the graphs that
enclose it.  Side-effecting ops inside a region thread the enclosing chain,
so buffer mutations stay ordered across control flow.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from max.dtype import DType
from max.graph.ops._common import as_tensor, current_graph, fail
from max.graph.type import Type, _ChainType
from max.graph.value import BufferValue, TensorValue, Value

__all__ = ["cond", "while_loop", "call", "fence"]


def _as_list(result: Any) -> list:
    if result is None:
        return []
    if isinstance(result, (list, tuple)):
        return list(result)
    return [result]


def _has_side_effects(block: Any) -> bool:
    return any(n.side_effects for n in block._nodes)


def _finish_block(block: Any, results: list, op: str, what: str) -> None:
    vals = []
    with block:
        for i, r in enumerate(results):
            if isinstance(r, Value) and not hasattr(r, "_bound"):
                vals.append(r)
            else:
                vals.append(as_tensor(r, op=op, arg=f"{what} result {i}"))
    block._outputs = tuple(vals)


def _scalar_bool(pred: TensorValue, op: str, what: str) -> None:
    if pred.dtype is not DType.bool or pred.rank != 0:
        fail(op, f"{what} must be a bool scalar (rank 0), got {pred.type}", TypeError)


def cond(pred: Any, out_types: Iterable[Type] | None, then_fn: Callable[[], Any],
         else_fn: Callable[[], Any]) -> list[TensorValue]:
    """Run ``then_fn`` when ``pred`` is true, else ``else_fn``; both must return ``out_types``.

    Returns the chosen branch's results (``[]`` when ``out_types`` is None).
    Raises ValueError when a branch returns a different number or types of values.
    """
    op = "cond"
    p = as_tensor(pred, op=op, arg="pred")
    _scalar_bool(p, op, "pred")
    types = [] if out_types is None else list(out_types)
    for i, t in enumerate(types):
        if not isinstance(t, Type):
            fail(op, f"out_types[{i}] must be a graph Type (e.g. TensorType), got {t!r}", TypeError)
    g = current_graph(op)
    blocks = []
    for name, fn in (("then", then_fn), ("else", else_fn)):
        block = g._new_block(f"{g.name}.{op}.{name}")
        with block:
            results = _as_list(fn())
        if len(results) != len(types):
            fail(op, f"{name}_fn returned {len(results)} value(s), out_types has {len(types)}")
        _finish_block(block, results, op, f"{name}_fn")
        for i, (v, t) in enumerate(zip(block._outputs, types)):
            if v.type != t:
                fail(op, f"{name}_fn result {i} has type {v.type}, out_types[{i}] is {t}")
        blocks.append(block)
    effects = any(_has_side_effects(b) for b in blocks)
    operands = [p] + ([g._current_chain] if effects else [])
    res = g._add_node(op, operands, types + ([_ChainType()] if effects else []), {"_multi": True},
                      side_effects=effects, regions=tuple(blocks))
    if effects:
        g._current_chain = res[-1]
        res = res[:-1]
    return res


def while_loop(initial_values: Iterable[Any] | Any, predicate: Callable[..., Any],
               body: Callable[..., Any]) -> list[TensorValue]:
    """Loop while ``predicate(*values)`` is true, replacing values with ``body(*values)``.

    Raises ValueError when ``initial_values`` is empty or the body changes
    the number or types of the loop values; NotImplementedError for buffers.
    """
    op = "while_loop"
    init = [initial_values] if isinstance(initial_values, Value) or not isinstance(
        initial_values, (list, tuple)) else list(initial_values)
    if not init:
        raise ValueError("While loops must have at least one iteration value.")
    vals = []
    for i, v in enumerate(init):
        if isinstance(v, BufferValue):
            raise NotImplementedError(f"{op}: initial_values[{i}] is a buffer; buffers are not supported in loops")
        vals.append(as_tensor(v, op=op, arg=f"initial_values[{i}]"))
    types = [v.type for v in vals]
    g = current_graph(op)
    pblock = g._new_block(f"{g.name}.{op}.pred", types)
    with pblock:
        pres = _as_list(predicate(*pblock.inputs))
    if len(pres) != 1:
        fail(op, f"predicate must return one bool scalar, returned {len(pres)} values")
    _finish_block(pblock, pres, op, "predicate")
    _scalar_bool(pblock._outputs[0], op, "predicate result")
    bblock = g._new_block(f"{g.name}.{op}.body", types)
    with bblock:
        bres = _as_list(body(*bblock.inputs))
    if len(bres) != len(types):
        fail(op, f"body returned {len(bres)} value(s), the loop carries {len(types)}")
    _finish_block(bblock, bres, op, "body")
    for i, (v, t) in enumerate(zip(bblock._outputs, types)):
        if v.type != t:
            fail(op, f"body result {i} has type {v.type}, but the loop value has type {t}; "
                     "loop bodies must keep each value's dtype, shape and device")
    effects = _has_side_effects(pblock) or _has_side_effects(bblock)
    operands = vals + ([g._current_chain] if effects else [])
    res = g._add_node(op, operands, types + ([_ChainType()] if effects else []), {"_multi": True},
                      side_effects=effects, regions=(pblock, bblock))
    if effects:
        g._current_chain = res[-1]
        res = res[:-1]
    return res


def call(graph: Any, *args: Any, prefix: str = "") -> list[Value]:
    """Call a subgraph (``Graph.add_subgraph``) with ``args``; returns its results (chain excluded)."""
    op = "call"
    from max.graph.graph import Graph

    if not isinstance(graph, Graph):
        fail(op, f"graph must be a Graph, got {type(graph).__name__}", TypeError)
    if graph._outputs is None:
        fail(op, f"subgraph {graph.name!r} has no outputs yet; call its output(...) first")
    want = [t for t in graph._input_types if not isinstance(t, _ChainType)]
    if len(args) != len(want):
        fail(op, f"subgraph {graph.name!r} takes {len(want)} argument(s), got {len(args)}")
    g = current_graph(op)
    vals = []
    for i, (a, t) in enumerate(zip(args, want)):
        v = a if isinstance(a, BufferValue) else as_tensor(a, op=op, arg=f"args[{i}]")
        if v.type != t:
            fail(op, f"argument {i} of {graph.name!r} has type {v.type}, the subgraph expects {t}")
        vals.append(v)
    out_types = list(graph.output_types)
    effects = _has_side_effects(graph)
    operands = vals + [g._current_chain]
    res = g._add_node(op, operands, out_types + [_ChainType()],
                      {"prefix": prefix, "_subgraph": graph.name, "_multi": True}, side_effects=effects,
                      regions=(graph,))
    if effects:
        g._current_chain = res[-1]
    return res[:-1]


def fence(*values: Any) -> list[Value]:
    """Identity on ``values`` that nothing is reordered across (a scheduling barrier)."""
    op = "fence"
    if not values:
        fail(op, "needs at least one value")
    g = current_graph(op)
    vals = [v if isinstance(v, (BufferValue,)) else as_tensor(v, op=op, arg=f"values[{i}]")
            for i, v in enumerate(values)]
    res = g._add_node(op, vals + [g._current_chain], [v.type for v in vals] + [_ChainType()], {"_multi": True},
                      side_effects=True)
    g._current_chain = res[-1]
    return res[:-1]
