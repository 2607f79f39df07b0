"""Complex-number layout ops: ``as_interleaved_complex``.

Complex values are stored as real tensors whose last dim of size 2 holds
(real, imag); ``irfft(..., input_is_complex=True)`` reads that layout.
"""

from __future__ import annotations

from typing import Any

from max.graph.dim import StaticDim
from max.graph.ops._common import as_tensor, fail, stage1
from max.graph.shape import Shape
from max.graph.type import TensorType
from max.graph.value import TensorValue

__all__ = ["as_interleaved_complex"]


def as_interleaved_complex(x: Any) -> TensorValue:
    """View ``[..., D]`` of alternating (real, imag) values as ``[..., D // 2, 2]``.

    The last dim must be static and even.  Raises ValueError otherwise (and
    for a rank-0 input).
    """
    op = "as_interleaved_complex"
    x = as_tensor(x, op=op)
    if x.rank < 1:
        fail(op, f"x must have rank >= 1, got a scalar {x.type}")
    last = x.shape[-1]
    if not isinstance(last, StaticDim):
        fail(op, f"the last dim of x must be static (and even), got symbolic dim {last}")
    if last.dim % 2:
        fail(op, f"the last dim of x must be even (pairs of real, imag), got {x.shape}")
    shape = Shape([*x.shape[:-1], StaticDim(last.dim // 2), StaticDim(2)])
    return stage1(op, [x], TensorType(x.dtype, shape, x.device))
