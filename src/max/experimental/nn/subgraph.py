"""``as_subgraph``: lower each traced call of a module into one shared subgraph (``ops.call``)."""

from __future__ import annotations

from typing import Any, TypeVar

from max.experimental._trace import _SUBGRAPH_ATTR
from max.experimental.nn.module import Module

__all__ = ["as_subgraph"]

_T = TypeVar("_T")


def as_subgraph(module: _T | None = None, *, name: str | None = None) -> Any:
    """Mark a ``Module`` subclass (class decorator) or instance so that, while a graph is being
    built (``Module.compile``, or a module called inside ``with Graph(...)``), each call becomes
    one ``ops.call`` of a subgraph instead of inlining its ops.

    Tensor arguments and the module's parameters are the call's operands, so equal layers (same
    class, operand types and non-tensor arguments) share one subgraph body while each computes
    with its own weights.  With ``name``, every module marked with that name shares the subgraph
    of that name.  Eager calls run ``forward`` as usual; calls inside a subgraph body inline.
    Returns the class or instance it was given (``as_subgraph(name=...)`` returns a decorator).
    """
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"as_subgraph: name must be a non-empty str, got {name!r}")

    def mark(m: Any) -> Any:
        if isinstance(m, type):
            if not issubclass(m, Module):
                raise TypeError(f"as_subgraph: {m.__name__} is not a Module subclass")
            setattr(m, _SUBGRAPH_ATTR, name if name is not None else True)
            return m
        if not isinstance(m, Module):
            raise TypeError(f"as_subgraph: expected a Module or Module subclass, got {type(m).__name__}")
        object.__setattr__(m, _SUBGRAPH_ATTR, name if name is not None else True)
        return m

    return mark if module is None else mark(module)
