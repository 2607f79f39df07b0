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
    "acos": torch.acos,
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


@kernel("ceil")
def ceil(x: torch.Tensor) -> torch.Tensor:
    return x if not x.is_floating_point() else torch.ceil(x)


@kernel("floor_div")
def floor_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # Python ``//``: rounds toward negative infinity (integers and floats alike).
    return torch.div(a, b, rounding_mode="floor")


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


@kernel("cast_bits")
def cast_bits(x: torch.Tensor, src: str, dst: str) -> torch.Tensor:
    """Casts from/to the types torch lacks (float4_e2m1fn, float6_*), held as uint8 bit patterns:
    converted on the host through their ml_dtypes numpy types, rounding to nearest even."""
    import numpy as np

    from max.dtype import DType
    from max.dtype.dtype import BIT_STORED

    s, d = DType[src], DType[dst]
    host = x.detach().cpu()
    if s in BIT_STORED:
        arr = host.numpy().view(s.to_numpy()).astype(np.float32)
    elif s is DType.bfloat16 or s.is_float8():
        arr = host.to(torch.float32).numpy()
    else:
        arr = host.numpy()
    if d in BIT_STORED:
        out = torch.from_numpy(np.ascontiguousarray(arr.astype(np.float32).astype(d.to_numpy())).view(np.uint8))
    else:
        out = torch.from_numpy(np.ascontiguousarray(arr)).to(d.to_torch())
    return out.to(x.device)
