"""``ConstantLayerNorm``: layer normalisation whose scale is 1 and shift 0 (no weights to load)."""

from __future__ import annotations

from typing import Any

import numpy as np

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, ops
from max.nn.layer import Module, check_input, on_device

__all__ = ["ConstantLayerNorm"]


class ConstantLayerNorm(Module):
    """``(x - mean) / sqrt(var + eps)`` over the trailing ``dims`` (an int or a shape), with constant
    ``gamma`` (ones) and ``beta`` (zeros) arrays rather than weights."""

    def __init__(self, dims: Any, device: DeviceRef, dtype: DType, eps: float = 1e-5) -> None:
        super().__init__()
        shape = (dims,) if isinstance(dims, int) else tuple(int(d) for d in dims)
        if not shape or any(d <= 0 for d in shape):
            raise ValueError(f"ConstantLayerNorm: dims must be positive, got {dims!r}")
        self.dims = shape
        self.device = device if device is not None else DeviceRef.CPU()
        self.dtype = dtype
        self.eps = eps
        self.gamma = np.ones(shape, dtype=np.float32)
        self.beta = np.zeros(shape, dtype=np.float32)

    def __call__(self, x: Any) -> TensorValue:
        n = len(self.dims)
        v = on_device(check_input(self, x, min_rank=n, dtype=self.dtype), self.device)
        if [int(d) for d in v.shape[-n:]] != list(self.dims):
            raise ValueError(f"{self._layer_name}: input {v.shape} does not end in dims {list(self.dims)}")
        flat = ops.reshape(v, list(v.shape[:-n]) + [int(np.prod(self.dims))])
        size = int(np.prod(self.dims))
        gamma = ops.constant(self.gamma.reshape(size), self.dtype, self.device)
        beta = ops.constant(self.beta.reshape(size), self.dtype, self.device)
        return ops.reshape(ops.layer_norm(flat, gamma, beta, self.eps), v.shape)
