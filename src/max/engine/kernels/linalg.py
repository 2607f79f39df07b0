"""Kernels for ``max.graph.ops.linalg``."""

from __future__ import annotations

import torch

from max.engine.kernels import kernel


def _cpu_has_native_bf16() -> bool:
    """True when the CPU has bf16 matrix instructions (AVX512-BF16 or AMX), where torch's bf16 GEMM is fast."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


CPU_NATIVE_BF16 = _cpu_has_native_bf16()


def half_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b``; on CPUs without bf16/fp16 matrix units, half-precision operands are multiplied in
    float32 and rounded back (torch's CPU half GEMM is up to ~100x slower there; see bench/bf16_matmul.py)."""
    if a.device.type == "cpu" and a.dtype in (torch.bfloat16, torch.float16) and not (
            CPU_NATIVE_BF16 and a.dtype == torch.bfloat16):
        return torch.matmul(a.float(), b.float()).to(a.dtype)
    return torch.matmul(a, b)


@kernel("matmul")
def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype in (torch.bfloat16, torch.float16):
        return half_matmul(a, b)
    if not (a.is_floating_point() or a.is_complex()):
        if a.device.type == "cpu" and a.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            return torch.matmul(a, b)
        return torch.matmul(a.to(torch.int64), b.to(torch.int64)).to(a.dtype)
    return torch.matmul(a, b)


@kernel("outer")
def outer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.outer(a.reshape(-1), b.reshape(-1))
