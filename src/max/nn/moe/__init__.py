"""``max.nn.moe``: mixture-of-experts layers."""

from max.nn.moe.moe import MoE, MoEGate

__all__ = ["MoE", "MoEGate"]
