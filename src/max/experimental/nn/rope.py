"""Rotary positional embeddings: ``RotaryEmbedding`` (interleaved pairs), ``TransposedRotaryEmbedding``
(the half-split layout of GPT-NeoX/Llama-HF checkpoints) and ``positional_embedding``.

``weight`` is ``[max_sequence_length, head_dim // 2, 2]``: ``(cos, sin)`` of the angle
``position * base ** (-2 i / head_dim)`` for each frequency ``i``.  Inputs are
``[batch, seq_len, num_heads, head_dim]``; positions ``start_pos .. start_pos + seq_len``
are used.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from max.dtype import DType
from max.experimental.nn.module import Module
from max.experimental.tensor import Tensor
from max.graph.rope import rope_inv_freq

__all__ = ["RotaryEmbedding", "TransposedRotaryEmbedding", "positional_embedding"]


def positional_embedding(dim: int, base: float = 10000.0, max_sequence_length: int = 2048, *,
                         dtype: DType | None = None, device: Any = None) -> Tensor:
    """The ``[max_sequence_length, dim // 2, 2]`` table of ``(cos, sin)`` pairs (float64 math)."""
    if dim % 2:
        raise ValueError(f"positional_embedding: dim must be even, got {dim}")
    inv = rope_inv_freq(base, dim)
    ang = np.arange(max_sequence_length, dtype=np.float64)[:, None] * inv[None, :]
    table = np.stack([np.cos(ang), np.sin(ang)], axis=-1)
    return Tensor._constant(table, dtype=dtype, device=device)


def _F():
    from max.experimental import functional as F

    return F


class RotaryEmbedding(Module):
    """Applies RoPE to ``x`` ``[batch, seq, heads, head_dim]`` with consecutive ``(even, odd)`` pairs
    rotated as complex numbers."""

    def __init__(self, weight: Tensor) -> None:
        if len(weight.shape) != 3 or int(weight.shape[-1]) != 2:
            raise ValueError(f"{type(self).__name__}: weight must be [max_sequence_length, head_dim // 2, 2], "
                             f"got {[str(d) for d in weight.shape]}")
        self.weight = weight

    @property
    def dim(self) -> int:
        """The head dimension the table covers."""
        return 2 * int(self.weight.shape[1])

    def _table(self, x: Any, start_pos: Any) -> tuple[Any, Any]:
        F = _F()
        seq = x.shape[1]
        if int(x.shape[-1]) != self.dim:
            raise ValueError(f"{type(self).__name__}: x has head_dim {x.shape[-1]}, the table covers {self.dim}")
        w = F.cast(self.weight, x.dtype) if self.weight.dtype is not x.dtype else self.weight
        rows = w[start_pos:start_pos + seq] if isinstance(start_pos, int) else F.slice_tensor(
            w, [(slice(start_pos, start_pos + seq), seq)])
        cos = F.unsqueeze(rows[:, :, 0], 1)  # [seq, 1, half]
        sin = F.unsqueeze(rows[:, :, 1], 1)
        return cos, sin

    def _pairs(self, x: Any) -> tuple[Any, Any, Any]:
        F = _F()
        shape = list(x.shape)
        pairs = F.reshape(x, shape[:-1] + [self.dim // 2, 2])
        return pairs[..., 0], pairs[..., 1], shape

    def forward(self, x: Any, start_pos: Any = 0) -> Any:
        F = _F()
        cos, sin = self._table(x, start_pos)
        a, b, shape = self._pairs(x)
        out = F.stack([a * cos - b * sin, a * sin + b * cos], axis=-1)
        return F.reshape(out, shape)


class TransposedRotaryEmbedding(RotaryEmbedding):
    """RoPE with the head dim laid out as ``[first halves..., second halves...]`` (rotate-half)."""

    def _pairs(self, x: Any) -> tuple[Any, Any, Any]:
        half = self.dim // 2
        return x[..., :half], x[..., half:], list(x.shape)

    def forward(self, x: Any, start_pos: Any = 0) -> Any:
        F = _F()
        cos, sin = self._table(x, start_pos)
        a, b, _ = self._pairs(x)
        return F.concat([a * cos - b * sin, a * sin + b * cos], axis=-1)
