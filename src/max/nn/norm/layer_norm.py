"""Layer normalisation over the last dim: ``LayerNorm`` and the deprecated ``LayerNormV1``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, Weight, ops
from max.nn.layer import Layer, Module, check_input, on_device

__all__ = ["LayerNorm", "LayerNormV1"]


def _zeros_like_last(x: TensorValue) -> TensorValue:
    return ops.broadcast_to(ops.constant(0, x.dtype, x.device), [x.shape[-1]])


class LayerNorm(Module):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last dim (size ``dims``)."""

    def __init__(self, dims: int, device: DeviceRef, dtype: DType, eps: float = 1e-5, use_bias: bool = True) -> None:
        super().__init__()
        if isinstance(dims, bool) or not isinstance(dims, int) or dims <= 0:
            raise ValueError(f"LayerNorm: dims must be a positive int, got {dims!r}")
        self.dims = dims
        self.device = device if device is not None else DeviceRef.CPU()
        self.dtype = dtype
        self.eps = eps
        self.weight = Weight("weight", dtype, [dims], self.device)
        self.bias = Weight("bias", dtype, [dims], self.device) if use_bias else None

    def __call__(self, x: Any) -> TensorValue:
        v = on_device(check_input(self, x, min_rank=1, dtype=self.dtype, last_dim=self.dims), self.device)
        bias = self.bias if self.bias is not None else _zeros_like_last(v)
        return ops.layer_norm(v, self.weight, bias, self.eps)


@dataclass(eq=False)
class LayerNormV1(Layer):
    """Deprecated: LayerNorm with ``weight``/``bias`` given as graph values."""

    weight: Any
    bias: Any = None
    eps: float = 1e-6

    def __call__(self, x: Any) -> TensorValue:
        from max.graph.ops._common import as_tensor

        w = as_tensor(self.weight, op="LayerNormV1", arg="weight")
        v = check_input(self, x, min_rank=1, last_dim=w.shape[-1])
        b = as_tensor(self.bias, op="LayerNormV1", arg="bias") if self.bias is not None else _zeros_like_last(v)
        return ops.layer_norm(v, w, b, self.eps)
