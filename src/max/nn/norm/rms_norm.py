"""Root-mean-square normalisation: ``RMSNorm`` and the deprecated ``RMSNormV1``.

``y = x / sqrt(mean(x**2, -1) + eps) * (weight + weight_offset)``, computed in
float32 (float64 for float64 inputs).  ``multiply_before_cast=True`` (Gemma3)
multiplies by the weight in float32 and casts the product to the input dtype;
``False`` (Llama) casts the normalised input first, then multiplies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, Weight, ops
from max.graph.weight import ShardingStrategy
from max.nn.layer import Layer, Module, check_input, on_device

__all__ = ["RMSNorm", "RMSNormV1"]


def _rms_norm(x: TensorValue, weight: TensorValue, eps: float, weight_offset: float,
              multiply_before_cast: bool, who: str) -> TensorValue:
    if not x.dtype.is_float() or x.dtype.is_float8():
        raise TypeError(f"{who}: input must be a floating-point tensor, got {x.dtype}")
    acc = DType.float64 if x.dtype == DType.float64 else DType.float32
    w = on_device(weight, x.device)
    xf = x.cast(acc)
    normed = xf * ops.rsqrt(ops.mean(xf * xf, axis=-1) + eps)
    if multiply_before_cast:
        scale = w.cast(acc) + weight_offset if weight_offset else w.cast(acc)
        return (normed * scale).cast(x.dtype)
    scale = w.cast(x.dtype) + weight_offset if weight_offset else w.cast(x.dtype)
    return normed.cast(x.dtype) * scale


class RMSNorm(Module):
    """RMS normalisation over the last dim (size ``dim``) with a learned ``weight`` of shape ``[dim]``."""

    def __init__(self, dim: int, dtype: DType, eps: float = 1e-6, weight_offset: float = 0.0,
                 multiply_before_cast: bool = True) -> None:
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"RMSNorm: dim must be a positive int, got {dim!r}")
        self.dim = dim
        self.dtype = dtype
        self.eps = eps
        self.weight_offset = weight_offset
        self.multiply_before_cast = multiply_before_cast
        self.weight = Weight("weight", dtype, [dim], DeviceRef.CPU())

    def __call__(self, x: Any) -> TensorValue:
        v = check_input(self, x, min_rank=1, dtype=self.dtype, last_dim=self.dim)
        return _rms_norm(v, self.weight, self.eps, self.weight_offset, self.multiply_before_cast, self._layer_name)

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        return self.weight.sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        if not strategy.is_replicate:
            raise ValueError(f"{self._layer_name}: RMSNorm weights can only be replicated, got {strategy}")
        self.weight.sharding_strategy = strategy

    def shard(self, devices: Iterable[DeviceRef]) -> Sequence["RMSNorm"]:
        """One RMSNorm per device, each with a replica of ``weight``."""
        devs = list(devices)
        if self.weight.sharding_strategy is None:
            self.weight.sharding_strategy = ShardingStrategy.replicate(len(devs))
        out = []
        for w in self.weight.shard(devs):
            n = RMSNorm.__new__(RMSNorm)
            Module.__init__(n)
            n.dim, n.dtype, n.eps = self.dim, self.dtype, self.eps
            n.weight_offset, n.multiply_before_cast = self.weight_offset, self.multiply_before_cast
            n.weight = w
            out.append(n)
        return out


@dataclass(eq=False)
class RMSNormV1(Layer):
    """Deprecated: RMSNorm with ``weight`` given as a graph value."""

    weight: Any
    eps: float = 1e-6
    weight_offset: float = 0.0
    multiply_before_cast: bool = True

    def __call__(self, x: Any) -> TensorValue:
        from max.graph.ops._common import as_tensor

        w = as_tensor(self.weight, op="RMSNormV1", arg="weight")
        v = check_input(self, x, min_rank=1, last_dim=w.shape[-1])
        return _rms_norm(v, w, self.eps, self.weight_offset, self.multiply_before_cast, "RMSNormV1")
