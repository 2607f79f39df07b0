"""Debug ops: ``print``.

``print`` is side-effecting: it consumes the graph's current chain and
produces the next one, so prints run in the order they were staged and are
never removed, merged or constant-folded.
"""

from __future__ import annotations

from typing import Any

from max.graph.ops._common import as_tensor, current_graph, fail, stage
from max.graph.type import _ChainType

__all__ = ["print"]


def print(value: Any, label: str = "debug_tensor") -> None:  # noqa: A001 - reference name
    """At execution, print ``label: <values>`` for a tensor, or the string itself.

    Raises TypeError when ``label`` is not a str or ``value`` is neither a
    str nor a tensor value.
    """
    op = "print"
    if not isinstance(label, str):
        fail(op, f"label must be a str, got {type(label).__name__} {label!r}", TypeError)
    graph = current_graph(op)
    if isinstance(value, str):
        operands: list = []
        attrs: dict = {"text": value}
    else:
        operands = [as_tensor(value, op=op, arg="value")]
        attrs = {"label": label}
    (chain,) = stage(op, operands + [graph._current_chain], [_ChainType()], attrs, side_effects=True)
    graph._current_chain = chain
    return None
