"""Kernels for ``max.graph.ops.elementwise`` (operands arrive with equal dtypes)."""

from __future__ import annotations

import torch

from max.engine.kernels import kernel, register

for _name, _fn in {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "pow": torch.pow,
    "equal": torch.eq,
    "not_equal": torch.ne,
    "greater": torch.gt,
    "greater_equal": torch.ge,
    "logical_and": torch.logical_and,
    "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor,
    "logical_not": torch.logical_not,
    "abs": torch.abs,
    "negate": torch.neg,
    "exp": torch.exp,
    "log": torch.log,
    "log1p": torch.log1p,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "sin": torch.sin,
    "cos": torch.cos,
    "tanh": torch.tanh,
    "atanh": torch.atanh,
    "erf": torch.erf,
    "sigmoid": torch.sigmoid,
    "silu": torch.nn.functional.silu,
    "relu": torch.relu,
    "round": torch.round,
    "is_nan": torch.isnan,
    "is_inf": torch.isinf,
    "max": torch.maximum,
    "min": torch.minimum,
    "where": torch.where,
}.items():
    register(_name, _fn)


@kernel("mod")
def mod(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # Python semantics: the result has the sign of the divisor.
    return torch.remainder(a, b)


@kernel("floor")
def floor(x: torch.Tensor) -> torch.Tensor:
    return x if not x.is_floating_point() else torch.floor(x)


@kernel("trunc")
def trunc(x: torch.Tensor) -> torch.Tensor:
    return x if not x.is_floating_point() else torch.trunc(x)


@kernel("gelu")
def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    if approximate == "quick":
        return x * torch.sigmoid(1.702 * x)
    return torch.nn.functional.gelu(x, approximate=approximate)


@kernel("cast")
def cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype)
