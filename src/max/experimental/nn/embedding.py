"""``Embedding``: a lookup table ``weight[indices]``."""

from __future__ import annotations

from typing import Any

from max.dtype import DType
from max.experimental import random
from max.experimental.nn.module import Module

__all__ = ["Embedding"]


class Embedding(Module):
    """A vector embedding: ``forward(indices)`` gathers rows of ``weight`` (``[vocab_size, *dims]``).

    Give the row shape as ``dim=`` (one dim) or ``dims=`` (several).  Fresh weights are
    standard normal (PyTorch's init).
    """

    def __init__(self, vocab_size: int, *, dim: int | None = None, dims: Any = None,
                 dtype: DType | None = None, device: Any = None) -> None:
        if (dim is None) == (dims is None):
            raise ValueError("Embedding: give exactly one of dim= and dims=")
        row = [dim] if dim is not None else list(dims)
        for v in [vocab_size, *row]:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Embedding: sizes must be positive ints, got vocab_size={vocab_size!r}, "
                                 f"dims={row!r}")
        self.weight = random.normal([vocab_size, *row], dtype=dtype, device=device)

    @property
    def vocab_size(self) -> int:
        return int(self.weight.shape[0])

    @property
    def dim(self) -> int:
        return int(self.weight.shape[1])

    def forward(self, indices: Any) -> Any:
        from max.experimental import functional as F

        return F.gather(self.weight, indices, axis=0)
