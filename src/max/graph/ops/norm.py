"""Normalisation ops: ``layer_norm``, ``rms_norm`` and ``group_norm``.

``layer_norm(input, gamma, beta, epsilon)`` normalises over the last dim:
``(x - mean) / sqrt(var + epsilon) * gamma + beta`` with the population
variance.  ``input`` must be a floating-point tensor of rank >= 1; ``gamma``
and ``beta`` must have shape ``[input.shape[-1]]`` (symbolic dims must match
by name) and a floating-point dtype (they are cast to ``input``'s dtype);
``epsilon`` must be a positive number.  The result has ``input``'s type.

``rms_norm(input, weight, epsilon, weight_offset=0.0, multiply_before_cast=False)``:
``x / sqrt(mean(x**2, -1) + epsilon) * (weight + weight_offset)`` over the
last dim, computed in float32 for half-precision inputs; with
``multiply_before_cast`` the weight is applied before rounding back to the
input dtype (Gemma), otherwise after.

``group_norm(input, gamma, beta, num_groups, epsilon)``: ``input`` is
``[N, C, ...]``; the ``C`` channels split into ``num_groups`` groups
normalised together over the channel group and all trailing dims, then
``* gamma[c] + beta[c]`` (``gamma``, ``beta``: ``[C]``).

``gated_rms_norm(input, gate, weight, epsilon, num_groups=1, norm_before_gate=False)`` (libremax
extension: the norm after a Mamba-2 / gated DeltaNet mixer), float32 ``input`` / ``gate`` ``[..., D]``,
``weight [D]``: with ``g = silu(gate)`` (1 when ``gate`` is None), each of the ``num_groups`` groups of
``D / num_groups`` channels is ``h / sqrt(mean(h**2) + epsilon) * weight`` with ``h = input * g``, or, with
``norm_before_gate``, ``input / sqrt(mean(input**2) + epsilon) * weight * g``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from max.dtype import DType
from max.graph.dim import StaticDim
from max.graph.ops._common import as_tensor, fail, same_device, stage1
from max.graph.ops.elementwise import cast
from max.graph.value import TensorValue

__all__ = ["gated_rms_norm", "group_norm", "layer_norm", "rms_norm"]


def _float_input(op: str, input: Any, min_rank: int, what: str) -> TensorValue:  # noqa: A002
    x = as_tensor(input, op=op, arg="input")
    if x.rank < min_rank:
        fail(op, f"input must have rank >= {min_rank} ({what}), got {x.type}")
    if not x.dtype.is_float() or x.dtype.is_float8() or x.dtype.size_in_bytes < 2:
        fail(op, f"input must be a float16/bfloat16/float32/float64 tensor, got {x.dtype}; cast it first",
             TypeError)
    return x


def _params(op: str, x: TensorValue, size: Any, where: str, **named: Any) -> list[TensorValue]:
    """1-D float parameters of length ``size`` (cast to ``x``'s dtype)."""
    params = []
    for name, p in named.items():
        v = as_tensor(p, op=op, arg=name, dtype=x.dtype if not isinstance(p, TensorValue) else None,
                      device=x.device)
        if v.rank != 1 or v.shape[0] != size:
            fail(op, f"{name} has shape {v.shape}, expected [{size}] ({where} of input {x.shape})")
        if not v.dtype.is_float() or v.dtype.is_float8():
            fail(op, f"{name} must be a floating-point tensor, got {v.dtype}", TypeError)
        params.append(v)
    same_device(op, x, *params)
    return [cast(v, x.dtype) for v in params]


def _epsilon(op: str, epsilon: Any) -> float:
    if isinstance(epsilon, (bool, np.bool_)) or not isinstance(epsilon, (int, float, np.integer, np.floating)):
        fail(op, f"epsilon must be a float, got {type(epsilon).__name__} {epsilon!r}", TypeError)
    eps = float(epsilon)
    if eps <= 0:  # MAX's check (NaN passes it, as in MAX)
        raise ValueError(f"epsilon must be positive, got {epsilon!r} ({op})")
    return eps


def layer_norm(input: Any, gamma: Any, beta: Any, epsilon: float) -> TensorValue:  # noqa: A002
    """Layer normalisation over the last dimension of ``input``."""
    op = "layer_norm"
    x = _float_input(op, input, 1, "it is normalised over its last dim")
    for name, p in (("Gamma", gamma), ("Beta", beta)):
        shape = getattr(p, "shape", None)
        if shape is not None and len(shape) == 1 and shape[0] != x.shape[-1]:
            raise ValueError(f"{name} size {shape[0]} does not match dimension of reduction {x.shape[-1]}.")
    g, b = _params(op, x, x.shape[-1], "the last dim", gamma=gamma, beta=beta)
    return stage1(op, [x, g, b], x.type, {"epsilon": _epsilon(op, epsilon)})


def rms_norm(input: Any, weight: Any, epsilon: float = 1e-6, weight_offset: float = 0.0,  # noqa: A002
             multiply_before_cast: bool = False) -> TensorValue:
    """Root-mean-square normalisation over the last dimension, scaled by ``weight + weight_offset``."""
    op = "rms_norm"
    x = _float_input(op, input, 1, "it is normalised over its last dim")
    (w,) = _params(op, x, x.shape[-1], "the last dim", weight=weight)
    if isinstance(weight_offset, (bool, np.bool_)) or not isinstance(
            weight_offset, (int, float, np.integer, np.floating)):
        fail(op, f"weight_offset must be a float, got {type(weight_offset).__name__} {weight_offset!r}", TypeError)
    if not isinstance(multiply_before_cast, (bool, np.bool_)):
        fail(op, f"multiply_before_cast must be a bool, got {type(multiply_before_cast).__name__}", TypeError)
    attrs = {"epsilon": _epsilon(op, epsilon), "weight_offset": float(weight_offset),
             "multiply_before_cast": bool(multiply_before_cast)}
    return stage1(op, [x, w], x.type, attrs)


def group_norm(input: Any, gamma: Any, beta: Any, num_groups: int, epsilon: float) -> TensorValue:  # noqa: A002
    """Group normalisation of ``[N, C, ...]`` input over channel groups and trailing dims."""
    op = "group_norm"
    x = _float_input(op, input, 2, "[N, C, ...]")
    if isinstance(num_groups, (bool, np.bool_)) or not isinstance(num_groups, (int, np.integer)):
        fail(op, f"num_groups must be an int, got {type(num_groups).__name__} {num_groups!r}", TypeError)
    groups = int(num_groups)
    if groups < 1:
        fail(op, f"num_groups must be >= 1, got {groups}")
    c = x.shape[1]
    if isinstance(c, StaticDim) and c.dim % groups:
        fail(op, f"the channel dim {c} of input {x.shape} is not divisible by num_groups={groups}")
    g, b = _params(op, x, c, "the channel dim", gamma=gamma, beta=beta)
    return stage1(op, [x, g, b], x.type, {"num_groups": groups, "epsilon": _epsilon(op, epsilon)})


def gated_rms_norm(input: Any, gate: Any, weight: Any, epsilon: float, num_groups: int = 1,  # noqa: A002
                   norm_before_gate: bool = False) -> TensorValue:
    """RMS norm over channel groups of the last dim, gated by ``silu(gate)`` before or after it (float32)."""
    op = "gated_rms_norm"
    x = _float_input(op, input, 1, "it is normalised over its last dim")
    if x.dtype != DType.float32:
        fail(op, f"input must be float32, got {x.dtype}; cast it first", TypeError)
    (w,) = _params(op, x, x.shape[-1], "the last dim", weight=weight)
    operands = [x, w]
    if gate is not None:
        z = as_tensor(gate, op=op, arg="gate")
        if z.dtype != DType.float32 or z.rank != x.rank:
            fail(op, f"gate must be a float32 tensor of input's rank {x.rank}, got {z.type}", TypeError)
        for i, (a, b) in enumerate(zip(z.shape, x.shape)):
            if isinstance(a, StaticDim) and isinstance(b, StaticDim) and a != b:
                fail(op, f"gate shape {z.shape} differs from input shape {x.shape} at dim {i}")
        same_device(op, x, z)
        operands.append(z)
    if isinstance(num_groups, (bool, np.bool_)) or not isinstance(num_groups, (int, np.integer)) or num_groups < 1:
        fail(op, f"num_groups must be a positive int, got {num_groups!r}", TypeError)
    d = x.shape[-1]
    if not isinstance(d, StaticDim) or d.dim % int(num_groups):
        fail(op, f"the last dim {d} of input {x.shape} must be static and divisible by num_groups={num_groups}")
    return stage1(op, operands, x.type, {"epsilon": _epsilon(op, epsilon), "num_groups": int(num_groups),
                                         "norm_before_gate": bool(norm_before_gate), "has_gate": gate is not None})
