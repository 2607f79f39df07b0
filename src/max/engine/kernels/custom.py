"""Kernels for ``ops.custom`` / ``ops.inplace_custom``: dispatch to the user's registered function."""

from __future__ import annotations

import torch

from max.engine.kernels import kernel
from max.graph.kernel_library import _REGISTRY, unknown_kernel_message


def _call(symbol: str, args: tuple, parameters: dict, out_dtypes: tuple) -> tuple:
    k = _REGISTRY.get(symbol)
    if k is None:
        raise RuntimeError(unknown_kernel_message(symbol))
    res = k.fn(*args, **parameters)
    if res is None:
        res = ()
    elif isinstance(res, torch.Tensor):
        res = (res,)
    else:
        res = tuple(res)
    if len(res) != len(out_dtypes):
        raise RuntimeError(f"custom kernel {symbol!r} returned {len(res)} output(s), out_types has {len(out_dtypes)}")
    for i, (r, dt) in enumerate(zip(res, out_dtypes)):
        if dt is not None and r.dtype != dt:
            raise RuntimeError(f"custom kernel {symbol!r} output {i} has dtype {r.dtype}, out_types says {dt}")
    return res


@kernel("custom", pure=False)
def custom(*args: torch.Tensor, symbol: str, parameters: dict, out_dtypes: tuple, device: torch.device) -> tuple:
    return _call(symbol, args, parameters, out_dtypes)


@kernel("inplace_custom", pure=False)
def inplace_custom(*args: torch.Tensor, symbol: str, parameters: dict, out_dtypes: tuple,
                   device: torch.device) -> tuple:
    return _call(symbol, args, parameters, out_dtypes)
