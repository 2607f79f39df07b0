"""Kernels for ``max.graph.ops.complex``."""

from __future__ import annotations

import torch

from max.engine.kernels import kernel


@kernel("as_interleaved_complex")
def as_interleaved_complex(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
