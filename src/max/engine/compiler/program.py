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

    def producer_map(self) -> dict[int, PNode]:
        return {o: n for n in self.nodes for o in n.outs}


class VerificationError(ValueError):
    """The graph is not well-formed; it never reaches the engine."""


def from_graph(graph: Any) -> Program:
    """Flatten ``graph`` (verifying it on the way)."""
    ids: dict[int, int] = {}
    types: dict[int, Type] = {}
    counter = 0

    def vid(v: Any) -> int:
        nonlocal counter
        k = id(v._node), v._index
        key = hash(k)
        r = ids.get(key)
        if r is None:
            r = ids[key] = counter
            types[r] = v._type
            counter += 1
        return r

    if graph._outputs is None:
        raise VerificationError(
            f"graph {graph.name!r} has no outputs: call graph.output(...) (with no arguments for a graph "
            "that only has side effects)"
        )
    defined: set[int] = set()
    nodes: list[PNode] = []
    input_ids = []
    chain_users: dict[int, str] = {}
    for node in graph._nodes:
        ins = []
        for v in node.inputs:
            i = vid(v)
            if i not in defined:
                raise VerificationError(
                    f"{node.op} (created at {node.loc}) uses a value defined after it or in another graph"
                )
            if isinstance(v._type, _ChainType) and node.side_effects and node.op != "merge_chains":
                prev = chain_users.get(i)
                if prev is not None:
                    raise VerificationError(
                        f"{node.op} (created at {node.loc}) reuses a chain already consumed by {prev}; "
                        "side-effecting ops must thread Graph._current_chain"
                    )
                chain_users[i] = f"{node.op} at {node.loc}"
            ins.append(i)
        outs = tuple(vid(r) for r in node.results)
        defined.update(outs)
        if node.op == "input":
            input_ids.append(outs[0])
            continue
        nodes.append(
            PNode(node.op, tuple(ins), dict(node.attrs), tuple(r._type for r in node.results), outs,
                  node.loc, node.side_effects, node.regions)
        )
    out_ids = []
    for k, v in enumerate(graph._outputs):
        i = vid(v)
        if i not in defined:
            raise VerificationError(f"graph {graph.name!r}: output {k} is not a value of this graph")
        out_ids.append(i)
    for t in graph._input_types:
        if not isinstance(t, (TensorType, BufferType, _ChainType)):
            raise VerificationError(f"graph {graph.name!r}: unsupported input type {t}")
    return Program(
        name=graph.name,
        input_ids=tuple(input_ids),
        input_types=tuple(graph._input_types),
        nodes=nodes,
        output_ids=tuple(out_ids),
        output_types=tuple(types[i] for i in out_ids),
        types=types,
        weights={name: w for name, (w, _) in graph._weights.items()},
    )
