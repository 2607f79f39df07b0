"""``custom`` and ``inplace_custom``: call a user kernel registered by name."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from max.dtype import DType
from max.graph.kernel_library import _REGISTRY, unknown_kernel_message
from max.graph.ops._common import as_device_ref, as_tensor, current_graph, fail
from max.graph.type import Type, _ChainType
from max.graph.value import BufferValue, Value

__all__ = ["custom", "inplace_custom"]


def _check_params(op: str, parameters: Mapping[str, Any] | None) -> dict:
    params = dict(parameters or {})
    for k, v in params.items():
        if not isinstance(k, str):
            fail(op, f"parameter names must be str, got {k!r}", TypeError)
        if not isinstance(v, (bool, int, str, DType)):
            fail(op, f"parameter {k!r} must be a bool, int, str or DType, got {type(v).__name__}", TypeError)
    return params


def _stage_custom(op: str, name: str, device: Any, values: Sequence[Any], out_types: Sequence[Type],
                  parameters: Mapping[str, Any] | None, inplace: bool) -> list:
    if not isinstance(name, str) or not name:
        fail(op, f"name must be a non-empty str, got {name!r}", TypeError)
    dev = as_device_ref(device, op)
    g = current_graph(op)
    root = g._root()
    if root._custom_extensions and not getattr(root, "_extensions_loaded", False):
        from max.graph.kernel_library import load_extension

        for e in root._custom_extensions:
            load_extension(e)
        root._extensions_loaded = True
    if name not in _REGISTRY and root._custom_extensions:
        fail(op, unknown_kernel_message(name))
    vals = []
    for i, v in enumerate(values):
        vals.append(v if isinstance(v, (BufferValue,)) or (isinstance(v, Value) and not hasattr(v, "_bound")
                                                            and not hasattr(v, "dtype"))
                    else as_tensor(v, op=op, arg=f"values[{i}]"))
    types = list(out_types or [])
    for i, t in enumerate(types):
        if not isinstance(t, Type):
            fail(op, f"out_types[{i}] must be a graph Type, got {t!r}", TypeError)
    params = _check_params(op, parameters)
    effects = inplace or any(isinstance(v, BufferValue) for v in vals)
    attrs = {"symbol": name, "parameters": params, "out_dtypes": tuple(getattr(t, "dtype", None) for t in types),
             "device": dev, "_multi": True}
    operands = vals + ([g._current_chain] if effects else [])
    res = g._add_node(op, operands, types + ([_ChainType()] if effects else []), attrs, side_effects=effects)
    if effects:
        g._current_chain = res[-1]
        res = res[:-1]
    return res


def custom(name: str, device: Any, values: Sequence[Any], out_types: Sequence[Type],
           parameters: Mapping[str, Any] | None = None) -> list:
    """Call the custom kernel ``name``; its results match ``out_types`` 1:1."""
    return _stage_custom("custom", name, device, values, out_types, parameters, False)


def inplace_custom(name: str, device: Any, values: Sequence[Any], out_types: Sequence[Type] | None = None,
                   parameters: Mapping[str, Any] | None = None) -> list:
    """Call the custom kernel ``name`` that mutates its buffer operands (ordered by the chain)."""
    return _stage_custom("inplace_custom", name, device, values, out_types or [], parameters, True)
