"""Kernels for ``max.graph.ops.reduction`` (``axis`` arrives normalised, >= 0).

torch lacks most CPU kernels for uint16/uint32/uint64, so those inputs are
computed in int64 and cast back (two's-complement wrap-around keeps sums of
uint64 exact; max/min/sort of uint64 values >= 2**63 are not supported).
Half-precision softmax and cumsum on CPU run in float32 and round back.
"""

from __future__ import annotations

import torch

from max.engine.kernels import kernel

_WIDEN = (torch.uint16, torch.uint32, torch.uint64)
_HALF = (torch.float16, torch.bfloat16)


def _wide(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.int64) if x.dtype in _WIDEN else x


def _cpu_half(x: torch.Tensor) -> bool:
    return x.dtype in _HALF and x.device.type == "cpu"


@kernel("sum")
def sum_(x: torch.Tensor, axis: int) -> torch.Tensor:
    if x.dtype in _WIDEN:
        return torch.sum(x.to(torch.int64), dim=axis, keepdim=True).to(x.dtype)
    return torch.sum(x, dim=axis, keepdim=True, dtype=x.dtype)


@kernel("mean")
def mean(x: torch.Tensor, axis: int) -> torch.Tensor:
    if x.is_floating_point():
        return torch.mean(x, dim=axis, keepdim=True)
    # integer mean: int64 sum divided by the count, rounded toward zero
    s = torch.sum(x.to(torch.int64), dim=axis, keepdim=True)
    n = x.shape[axis]
    return torch.div(s, n if n > 0 else 1, rounding_mode="trunc").to(x.dtype)


@kernel("prod")
def prod(x: torch.Tensor, axis: int) -> torch.Tensor:
    if x.dtype in _WIDEN:
        return torch.prod(x.to(torch.int64), dim=axis, keepdim=True).to(x.dtype)
    if _cpu_half(x):
        return torch.prod(x.float(), dim=axis, keepdim=True).to(x.dtype)
    return torch.prod(x, dim=axis, keepdim=True, dtype=x.dtype)


@kernel("reduce_max")
def reduce_max(x: torch.Tensor, axis: int) -> torch.Tensor:
    return torch.amax(_wide(x), dim=axis, keepdim=True).to(x.dtype)


@kernel("reduce_min")
def reduce_min(x: torch.Tensor, axis: int) -> torch.Tensor:
    return torch.amin(_wide(x), dim=axis, keepdim=True).to(x.dtype)


def _arg_operand(x: torch.Tensor) -> torch.Tensor:
    if x.dtype is torch.bool:
        return x.to(torch.uint8)
    return _wide(x)


@kernel("argmax")
def argmax(x: torch.Tensor, axis: int) -> torch.Tensor:
    return torch.argmax(_arg_operand(x), dim=axis, keepdim=True)


@kernel("argmin")
def argmin(x: torch.Tensor, axis: int) -> torch.Tensor:
    return torch.argmin(_arg_operand(x), dim=axis, keepdim=True)


@kernel("softmax")
def softmax(x: torch.Tensor, axis: int) -> torch.Tensor:
    if _cpu_half(x):
        return torch.softmax(x, dim=axis, dtype=torch.float32).to(x.dtype)
    return torch.softmax(x, dim=axis)


@kernel("logsoftmax")
def logsoftmax(x: torch.Tensor, axis: int) -> torch.Tensor:
    if _cpu_half(x):
        return torch.log_softmax(x, dim=axis, dtype=torch.float32).to(x.dtype)
    return torch.log_softmax(x, dim=axis)


@kernel("cumsum")
def cumsum(x: torch.Tensor, axis: int, exclusive: bool = False, reverse: bool = False) -> torch.Tensor:
    src = x.float() if _cpu_half(x) else _wide(x)
    if reverse:
        src = src.flip(axis)
    y = torch.cumsum(src, dim=axis, dtype=src.dtype)
    n = y.shape[axis]
    if exclusive and n > 0:
        # shift by one along the axis: [0, y0, y1, ..., y_{n-2}]
        y = torch.cat([torch.zeros_like(y.narrow(axis, 0, 1)), y.narrow(axis, 0, n - 1)], dim=axis)
    if reverse:
        y = y.flip(axis)
    return y.to(x.dtype)


@kernel("top_k")
def top_k(x: torch.Tensor, k: int, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = torch.topk(_wide(x), k, dim=axis, largest=True, sorted=True)
    return values.to(x.dtype), indices


@kernel("bottom_k")
def bottom_k(x: torch.Tensor, k: int, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = torch.topk(_wide(x), k, dim=axis, largest=False, sorted=True)
    return values.to(x.dtype), indices


@kernel("argsort")
def argsort(x: torch.Tensor, ascending: bool = True) -> torch.Tensor:
    return torch.argsort(_wide(x), dim=0, descending=not ascending, stable=True)
