"""Kernels for ``max.graph.ops.linalg``."""

from __future__ import annotations

import torch

from max.engine.kernels import kernel


@kernel("matmul")
def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype == torch.bfloat16 and a.device.type == "cpu":
        # CPUs without native bf16 matrix units run torch's bf16 GEMM far slower
        # than float32; compute in float32 and round back.
        return torch.matmul(a.float(), b.float()).to(torch.bfloat16)
    if not (a.is_floating_point() or a.is_complex()):
        if a.device.type == "cpu" and a.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            return torch.matmul(a, b)
        return torch.matmul(a.to(torch.int64), b.to(torch.int64)).to(a.dtype)
    return torch.matmul(a, b)


@kernel("outer")
def outer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.outer(a.reshape(-1), b.reshape(-1))
