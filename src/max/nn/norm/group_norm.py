"""Group normalisation (PyTorch ``group_norm`` semantics) over channels-first input ``(N, C, *)``."""

from __future__ import annotations

from typing import Any

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, Weight, ops
from max.nn.layer import Module, check_input, on_device

__all__ = ["GroupNorm"]


class GroupNorm(Module):
    """Normalise each group of ``num_channels // num_groups`` channels over the channels and spatial dims.

    Input ``(N, C, *)`` with ``C == num_channels``; ``weight``/``bias`` are
    float32 ``[C]`` (when ``affine``).  Statistics use the population variance.
    """

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True,
                 device: DeviceRef = DeviceRef.GPU(0)) -> None:
        super().__init__()
        if num_groups <= 0 or num_channels <= 0 or num_channels % num_groups:
            raise ValueError(
                f"GroupNorm: num_channels ({num_channels}) must be a positive multiple of num_groups ({num_groups})"
            )
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        self.device = device
        if affine:
            self.weight = Weight("weight", DType.float32, [num_channels], device)
            self.bias = Weight("bias", DType.float32, [num_channels], device)

    def __call__(self, x: Any) -> TensorValue:
        v = check_input(self, x, min_rank=2)
        if not v.dtype.is_float() or v.dtype.is_float8():
            raise TypeError(f"{self._layer_name}: input must be a floating-point tensor, got {v.dtype}")
        if str(v.shape[1]) != str(self.num_channels):
            raise ValueError(
                f"{self._layer_name}: input {v.type} has {v.shape[1]} channels (dim 1), expected {self.num_channels}"
            )
        v = on_device(v, self.device)
        shape = list(v.shape)
        acc = DType.float64 if v.dtype == DType.float64 else DType.float32
        xg = ops.reshape(v.cast(acc), [shape[0], self.num_groups, -1])
        mean = ops.mean(xg, axis=-1)
        centered = xg - mean
        var = ops.mean(centered * centered, axis=-1)
        normed = ops.reshape(centered * ops.rsqrt(var + self.eps), shape)
        if self.affine:
            bshape = [1, self.num_channels] + [1] * (len(shape) - 2)
            normed = normed * ops.reshape(self.weight.cast(acc), bshape) + ops.reshape(self.bias.cast(acc), bshape)
        return normed.cast(v.dtype)
