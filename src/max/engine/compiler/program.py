"""A graph flattened for the compiler: nodes with integer value ids.

The user's :class:`~max.graph.Graph` is never mutated by compilation; passes
work on this copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from max.graph.type import BufferType, TensorType, Type, _ChainType


@dataclass
class PNode:
    op: str
    inputs: tuple[int, ...]
    attrs: dict
    types: tuple[Type, ...]
    outs: tuple[int, ...]
    loc: str
    side_effects: bool = False
    regions: tuple = ()


@dataclass
class Program:
    name: str
    input_ids: tuple[int, ...]
    input_types: tuple[Type, ...]
    nodes: list[PNode]
    output_ids: tuple[int, ...]
    output_types: tuple[Type, ...]
    types: dict[int, Type] = field(default_factory=dict)
    weights: dict[str, Any] = field(default_factory=dict)  # name -> Weight
    free_ids: tuple = ()  # for regions: ids of enclosing-graph values passed after the block's inputs

    def producer_map(self) -> dict[int, PNode]:
        return {o: n for n in self.nodes for o in n.outs}


class VerificationError(ValueError):
    """The graph is not well-formed; it never reaches the engine."""


def from_graph(graph: Any) -> Program:
    """Flatten ``graph`` (verifying it on the way); regions become nested Programs."""
    if graph._outputs is None:
        raise VerificationError(
            f"graph {graph.name!r} has no outputs: call graph.output(...) (with no arguments for a graph "
            "that only has side effects)"
        )
    state = _State()
    prog, free = _flatten(graph, state, outer=None)
    assert not free
    return prog


class _State:
    def __init__(self) -> None:
        self.ids: dict[tuple, int] = {}
        self.types: dict[int, Type] = {}

    def vid(self, v: Any) -> int:
        k = (id(v._node), v._index)
        r = self.ids.get(k)
        if r is None:
            r = self.ids[k] = len(self.ids)
            self.types[r] = v._type
        return r


def _flatten(graph: Any, state: _State, outer: set | None) -> tuple[Program, list[int]]:
    """Flatten one graph or block.  ``outer``: ids visible from enclosing graphs (blocks only).

    Returns the program and its free variables (ids used here but defined outside, non-chain).
    """
    defined: set[int] = set()
    free: list[int] = []
    nodes: list[PNode] = []
    input_ids: list[int] = []
    chain_users: dict[int, str] = {}

    def use(v: Any, node: Any) -> int:
        i = state.vid(v)
        if i in defined:
            return i
        if outer is not None and i in outer:
            if not isinstance(v._type, _ChainType) and i not in free:
                free.append(i)
            return i
        raise VerificationError(
            f"{node.op} (created at {node.loc}) uses a value defined after it or in another graph"
        )

    for node in graph._nodes:
        ins = []
        for v in node.inputs:
            i = use(v, node)
            if isinstance(v._type, _ChainType) and node.side_effects and node.op not in ("merge_chains",):
                prev = chain_users.get(i)
                if prev is not None:
                    raise VerificationError(
                        f"{node.op} (created at {node.loc}) reuses a chain already consumed by {prev}; "
                        "side-effecting ops must thread Graph._current_chain"
                    )
                chain_users[i] = f"{node.op} at {node.loc}"
            ins.append(i)
        outs = tuple(state.vid(r) for r in node.results)
        if node.op == "input":
            defined.update(outs)
            input_ids.append(outs[0])
            continue
        regions: tuple = ()
        if node.regions:
            visible = defined | (outer or set())
            subs = []
            extra: list[int] = []
            for region in node.regions:
                if getattr(region, "_enclosing", None) is not None:
                    sub, sub_free = _flatten(region, state, visible)
                    sub.free_ids = tuple(sub_free)
                    for f in sub_free:
                        if f not in extra:
                            extra.append(f)
                        if f not in defined and f not in free:
                            free.append(f)
                else:  # a called subgraph: self-contained
                    sub = from_graph(region)
                    sub.free_ids = ()
                subs.append(sub)
            regions = tuple(subs)
            n_own = len(ins)
            ins = ins + [f for f in extra if f not in ins]
            attrs = dict(node.attrs)
            attrs["_nin"] = n_own
        else:
            attrs = dict(node.attrs)
        defined.update(outs)
        nodes.append(
            PNode(node.op, tuple(ins), attrs, tuple(r._type for r in node.results), outs,
                  node.loc, node.side_effects, regions)
        )
    out_ids = []
    for k, v in enumerate(graph._outputs or ()):
        i = state.vid(v)
        if i not in defined:
            if outer is not None and i in outer:
                if not isinstance(v._type, _ChainType) and i not in free:
                    free.append(i)
            else:
                raise VerificationError(f"graph {graph.name!r}: output {k} is not a value of this graph")
        out_ids.append(i)
    in_types = list(graph._input_types)
    for t in in_types:
        if not isinstance(t, (TensorType, BufferType, _ChainType)):
            raise VerificationError(f"graph {graph.name!r}: unsupported input type {t}")
    # a block receives its own inputs, then its free variables
    all_inputs = tuple(input_ids) + tuple(free)
    all_types = tuple(in_types) + tuple(state.types[f] for f in free)
    prog = Program(
        name=graph.name,
        input_ids=all_inputs,
        input_types=all_types,
        nodes=nodes,
        output_ids=tuple(out_ids),
        output_types=tuple(state.types[i] for i in out_ids),
        types=state.types,
        weights={name: w for name, (w, _) in graph._weights.items()},
    )
    return prog, free
