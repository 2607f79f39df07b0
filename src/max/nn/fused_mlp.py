"""``FusedMLP``: the gated MLP with its gate and up projections in one matmul."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, ops
from max.graph.quantization import QuantizationEncoding
from max.nn.layer import Module, check_input
from max.nn.linear import _ACTIVATIONS, Linear, gated_mlp_setup

__all__ = ["FusedMLP"]


class FusedMLP(Module):
    """``down_proj(act(gate) * up)`` where ``[gate, up] = split(gate_up_proj(x))``.

    The same function as :class:`max.nn.MLP`, with ``gate_proj`` and ``up_proj`` stacked into one Linear
    ``gate_up_proj`` of ``2 * feed_forward_length`` outputs (rows ``[0, ffl)`` the gate, ``[ffl, 2 ffl)``
    the up projection), so the input is read once.  Weights: ``gate_up_proj.weight``
    ``(2 * feed_forward_length, hidden_dim)`` and ``down_proj.weight`` ``(hidden_dim, feed_forward_length)``.
    """

    def __init__(self, dtype: DType, quantization_encoding: QuantizationEncoding | None, hidden_dim: int,
                 feed_forward_length: int, devices: Sequence[DeviceRef], linear_cls: Callable[..., Linear] = Linear,
                 has_bias: bool = False, activation_function: str = "silu", float8_config: Any = None) -> None:
        super().__init__()
        for arg, v in (("hidden_dim", hidden_dim), ("feed_forward_length", feed_forward_length)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"FusedMLP: {arg} must be a positive int, got {v!r}")
        kw = gated_mlp_setup(self, "FusedMLP", dtype, quantization_encoding, hidden_dim, feed_forward_length, devices,
                             has_bias, activation_function, float8_config)
        self.gate_up_proj = linear_cls(in_dim=hidden_dim, out_dim=2 * feed_forward_length, **kw)
        self.down_proj = linear_cls(in_dim=feed_forward_length, out_dim=hidden_dim, **kw)

    def __call__(self, x: Any) -> TensorValue:
        x = check_input(self, x, min_rank=1, last_dim=self.hidden_dim)
        gate_up = self.gate_up_proj(x)
        gate, up = ops.split(gate_up, [self.feed_forward_length, self.feed_forward_length], axis=-1)
        return self.down_proj(_ACTIVATIONS[self.activation_function](gate) * up)
