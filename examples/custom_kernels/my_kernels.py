"""Custom kernels for examples/04_custom_op.py: plain torch functions registered by name."""

import torch

from max.engine.custom import custom_op


@custom_op("swish_scaled")
def swish_scaled(x: torch.Tensor, *, beta: int) -> torch.Tensor:
    """x * sigmoid(beta * x)."""
    return x * torch.sigmoid(beta * x)


@custom_op("clamp_inplace", inplace=True)
def clamp_inplace(buf: torch.Tensor, *, limit: int) -> None:
    """Clamp a buffer to [-limit, limit] in place."""
    buf.clamp_(-limit, limit)
