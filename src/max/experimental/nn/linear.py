"""``Linear``: ``y = x @ weight.T + bias`` with ``weight`` of shape ``[out_dim, in_dim]``."""

from __future__ import annotations

import math
from typing import Any

from max.dtype import DType
from max.experimental import random
from max.experimental.nn.module import Module
from max.experimental.tensor import Tensor

__all__ = ["Linear"]


class Linear(Module):
    """A unary linear transformation over the last dim of its input.

    ``weight`` is ``[out_dim, in_dim]`` (PyTorch's layout, so ``nn.Linear`` state dicts
    load as they are) and ``bias`` ``[out_dim]`` (or 0 with ``bias=False``).  Fresh
    parameters are uniform in ``[-1/sqrt(in_dim), 1/sqrt(in_dim))`` (PyTorch's init).
    """

    def __init__(self, in_dim: int, out_dim: int, *, bias: bool = True, dtype: DType | None = None,
                 device: Any = None) -> None:
        for name, v in (("in_dim", in_dim), ("out_dim", out_dim)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Linear: {name} must be a positive int, got {v!r}")
        bound = 1.0 / math.sqrt(in_dim)
        self.in_dim = in_dim
        self.out_dim = out_dim
        self.weight = random.uniform([out_dim, in_dim], range=(-bound, bound), dtype=dtype, device=device)
        self.bias: Any = (random.uniform([out_dim], range=(-bound, bound), dtype=dtype, device=device)
                          if bias else 0)

    def forward(self, x: Any) -> Any:
        return x @ self.weight.T + self.bias

    @property
    def _has_bias(self) -> bool:
        return isinstance(self.bias, Tensor)
