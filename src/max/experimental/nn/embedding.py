"""``Embedding``: a lookup table ``weight[indices]``."""

from __future__ import annotations

from typing import Any

from max.dtype import DType
from max.experimental import random
from max.experimental.nn.module import Module
from max.graph.dim import Dim, StaticDim

__all__ = ["Embedding"]


class Embedding(Module):
    """A vector embedding: ``forward(indices)`` gathers rows of ``weight`` (``[vocab_size, *dims]``).

    Give the row shape as ``dim=`` (one dim) or ``dims=`` (several).  Fresh weights are
    standard normal (PyTorch's init).
    """

    def __init__(self, vocab_size: Any, *, dim: Any = None, dims: Any = None,
                 dtype: DType | None = None, device: Any = None) -> None:
        if (dim is None) == (dims is None):
            raise ValueError("Embedding: give exactly one of dim= and dims=")
        row = [dim] if dim is not None else list(dims)
        sizes = []
        for v in [vocab_size, *row]:
            d = None
            if not isinstance(v, bool):
                try:
                    d = Dim(v)
                except (TypeError, ValueError):
                    d = None
            if not isinstance(d, StaticDim) or d.dim < 1:
                raise ValueError(f"Embedding: sizes must be positive static dims, got vocab_size={vocab_size!r}, "
                                 f"dims={row!r}")
            sizes.append(d.dim)
        self.weight = random.normal(sizes, dtype=dtype, device=device)

    @property
    def vocab_size(self) -> int:
        return int(self.weight.shape[0])

    @property
    def dims(self) -> list[Dim]:
        """The shape of one embedded vector (``weight.shape[1:]``)."""
        return [Dim(d) for d in list(self.weight.shape)[1:]]

    @property
    def dim(self) -> Dim:
        """The vector size of a 1-d embedding (ValueError for an embedding of another rank)."""
        dims = self.dims
        if len(dims) != 1:
            raise ValueError(f"Embedding.dim: the embedding has {len(dims)} vector dims {dims}; use .dims")
        return dims[0]

    def __rich_repr__(self) -> Any:
        dims = self.dims
        yield "vocab_size", Dim(self.vocab_size)
        if len(dims) == 1:
            yield "dim", dims[0]
        else:
            yield "dims", list(dims)

    def forward(self, indices: Any) -> Any:
        from max.experimental import functional as F

        return F.gather(self.weight, indices, axis=0)
