"""Normalisation layers: ``RMSNorm``, ``GemmaRMSNorm``, ``LayerNorm``, ``GroupNorm`` and ``rms_norm``."""

from __future__ import annotations

from typing import Any

from max.dtype import DType
from max.experimental.nn.module import Module
from max.experimental.tensor import Tensor

__all__ = ["GemmaRMSNorm", "GroupNorm", "LayerNorm", "RMSNorm", "rms_norm"]


def _F():
    from max.experimental import functional as F

    return F


def rms_norm(x: Any, weight: Any, eps: float = 1e-6, weight_offset: float = 0.0,
             multiply_before_cast: bool = False) -> Any:
    """``x / sqrt(mean(x**2, -1) + eps) * (weight + weight_offset)`` (``max.graph.ops.rms_norm``)."""
    return _F().rms_norm(x, weight, eps, weight_offset=weight_offset, multiply_before_cast=multiply_before_cast)


class RMSNorm(Module):
    """Root-mean-square normalisation over the last dim, scaled by ``weight`` (ones at first)."""

    def __init__(self, dim: int, eps: float = 1e-6, *, dtype: DType | None = None, device: Any = None) -> None:
        self.eps = eps
        self.weight = Tensor.ones([dim], dtype=dtype, device=device)

    @property
    def dim(self) -> int:
        return int(self.weight.shape[0])

    def forward(self, x: Any) -> Any:
        return rms_norm(x, self.weight, self.eps)


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMS norm: scaled by ``1 + weight`` (zeros at first), the weight applied before
    rounding back to the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-6, *, dtype: DType | None = None, device: Any = None) -> None:
        self.eps = eps
        self.weight = Tensor.zeros([dim], dtype=dtype, device=device)

    def forward(self, x: Any) -> Any:
        return rms_norm(x, self.weight, self.eps, weight_offset=1.0, multiply_before_cast=True)


class LayerNorm(Module):
    """Layer normalisation over the last dim: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    ``elementwise_affine=False`` drops ``weight`` (ones) and ``use_bias=False`` ``bias`` (zeros);
    ``keep_dtype=False`` computes and returns float32.
    """

    def __init__(self, dim: int, eps: float = 1e-5, *, keep_dtype: bool = True, elementwise_affine: bool = True,
                 use_bias: bool = True, dtype: DType | None = None, device: Any = None) -> None:
        self.dim = dim
        self.eps = eps
        self.keep_dtype = keep_dtype
        self.weight = Tensor.ones([dim], dtype=dtype, device=device) if elementwise_affine else None
        self.bias = Tensor.zeros([dim], dtype=dtype, device=device) if elementwise_affine and use_bias else None

    def forward(self, x: Any) -> Any:
        F = _F()
        dt = x.dtype if self.keep_dtype else DType.float32
        y = F.cast(x, dt)
        gamma = F.cast(self.weight, dt) if self.weight is not None else F.broadcast_to(
            F.constant(1.0, dt, _device_of(x)), [self.dim])
        beta = F.cast(self.bias, dt) if self.bias is not None else F.broadcast_to(
            F.constant(0.0, dt, _device_of(x)), [self.dim])
        return F.layer_norm(y, gamma, beta, self.eps)


class GroupNorm(Module):
    """Group normalisation over ``[N, C, ...]`` input (``max.graph.ops.group_norm``)."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, *,
                 dtype: DType | None = None, device: Any = None) -> None:
        if num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels ({num_channels}) must be divisible by num_groups "
                             f"({num_groups})")
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        self.weight = Tensor.ones([num_channels], dtype=dtype, device=device) if affine else None
        self.bias = Tensor.zeros([num_channels], dtype=dtype, device=device) if affine else None

    def forward(self, x: Any) -> Any:
        F = _F()
        if self.weight is None:
            g = F.broadcast_to(F.constant(1.0, x.dtype, _device_of(x)), [self.num_channels])
            b = F.broadcast_to(F.constant(0.0, x.dtype, _device_of(x)), [self.num_channels])
        else:
            g, b = self.weight, self.bias
        return F.group_norm(x, g, b, self.num_groups, self.eps)


def _device_of(x: Any) -> Any:
    dev = x.device
    from max.graph.type import DeviceRef

    return dev if isinstance(dev, DeviceRef) else DeviceRef.from_device(dev)
