"""``Linear``: ``y = x @ weight.T + bias`` with ``weight`` of shape ``[out_dim, in_dim]``."""

from __future__ import annotations

import math
from typing import Any

from max.dtype import DType
from max.experimental import random
from max.experimental.nn.module import Module
from max.experimental.tensor import Tensor
from max.graph.dim import Dim, StaticDim

__all__ = ["Linear"]


class Linear(Module):
    """A unary linear transformation over the last dim of its input.

    ``weight`` is ``[out_dim, in_dim]`` (PyTorch's layout, so ``nn.Linear`` state dicts
    load as they are) and ``bias`` ``[out_dim]`` (or 0 with ``bias=False``).  Fresh
    parameters are uniform in ``[-1/sqrt(in_dim), 1/sqrt(in_dim))`` (PyTorch's init).
    """

    def __init__(self, in_dim: Any, out_dim: Any, *, bias: bool = True, dtype: DType | None = None,
                 device: Any = None) -> None:
        dims = []
        for name, v in (("in_dim", in_dim), ("out_dim", out_dim)):
            if isinstance(v, bool):
                raise ValueError(f"Linear: {name} must be a positive static dim, got {v!r}")
            try:
                d = Dim(v)
            except (TypeError, ValueError) as e:
                raise ValueError(f"Linear: {name} must be a positive static dim, got {v!r} ({e})") from None
            if not isinstance(d, StaticDim) or d.dim < 1:
                raise ValueError(f"Linear: {name} must be a positive static dim, got {v!r}")
            dims.append(d.dim)
        n_in, n_out = dims
        bound = 1.0 / math.sqrt(n_in)
        self.weight = random.uniform([n_out, n_in], range=(-bound, bound), dtype=dtype, device=device)
        self.bias: Any = (random.uniform([n_out], range=(-bound, bound), dtype=dtype, device=device)
                          if bias else 0)

    @property
    def in_dim(self) -> Dim:
        """The input dimension (read from ``weight``, so it follows a loaded state dict)."""
        return Dim(self.weight.shape[1])

    @property
    def out_dim(self) -> Dim:
        """The output dimension (``weight.shape[0]``)."""
        return Dim(self.weight.shape[0])

    def __rich_repr__(self) -> Any:
        yield "in_dim", self.in_dim
        yield "out_dim", self.out_dim
        yield "bias", self._has_bias, True  # shown only when False

    def forward(self, x: Any) -> Any:
        return x @ self.weight.T + self.bias

    @property
    def _has_bias(self) -> bool:
        return isinstance(self.bias, Tensor)
