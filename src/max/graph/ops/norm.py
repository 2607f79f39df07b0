"""Normalisation ops: ``layer_norm``.

``layer_norm(input, gamma, beta, epsilon)`` normalises over the last dim:
``(x - mean) / sqrt(var + epsilon) * gamma + beta`` with the population
variance.  ``input`` must be a floating-point tensor of rank >= 1; ``gamma``
and ``beta`` must have shape ``[input.shape[-1]]`` (symbolic dims must match
by name) and a floating-point dtype (they are cast to ``input``'s dtype);
``epsilon`` must be a positive number.  The result has ``input``'s type.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from max.graph.ops._common import as_tensor, fail, same_device, stage1
from max.graph.ops.elementwise import cast
from max.graph.value import TensorValue

__all__ = ["layer_norm"]


def layer_norm(input: Any, gamma: Any, beta: Any, epsilon: float) -> TensorValue:  # noqa: A002
    """Layer normalisation over the last dimension of ``input``."""
    op = "layer_norm"
    x = as_tensor(input, op=op, arg="input")
    if x.rank == 0:
        fail(op, "input must have rank >= 1 (it is normalised over its last dim), got a rank-0 tensor")
    if not x.dtype.is_float() or x.dtype.is_float8():
        fail(op, f"input must be a float16/bfloat16/float32/float64 tensor, got {x.dtype}; cast it first",
             TypeError)
    last = x.shape[-1]
    params = []
    for name, p in (("gamma", gamma), ("beta", beta)):
        v = as_tensor(p, op=op, arg=name, dtype=x.dtype if not isinstance(p, TensorValue) else None,
                      device=x.device)
        if v.rank != 1 or v.shape[0] != last:
            fail(op, f"{name} has shape {v.shape}, expected [{last}] (the last dim of input {x.shape})")
        if not v.dtype.is_float() or v.dtype.is_float8():
            fail(op, f"{name} must be a floating-point tensor, got {v.dtype}", TypeError)
        params.append(v)
    same_device(op, x, *params)
    g, b = (cast(v, x.dtype) for v in params)
    if isinstance(epsilon, (bool, np.bool_)) or not isinstance(epsilon, (int, float, np.integer, np.floating)):
        fail(op, f"epsilon must be a float, got {type(epsilon).__name__} {epsilon!r}", TypeError)
    eps = float(epsilon)
    if not (eps > 0 and math.isfinite(eps)):
        fail(op, f"epsilon must be a positive finite number, got {epsilon!r}")
    return stage1(op, [x, g, b], x.type, {"epsilon": eps})
