"""Kernels for ``max.graph.ops.shape``."""

from __future__ import annotations

import torch

from max.engine.kernels import kernel


@kernel("reshape")
def reshape(x: torch.Tensor, shape: tuple) -> torch.Tensor:
    return x.reshape(shape)


@kernel("shape_to_tensor")
def shape_to_tensor(shape: tuple) -> torch.Tensor:
    return torch.tensor(shape, dtype=torch.int64)
