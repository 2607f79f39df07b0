"""Kernels for ``max.graph.ops.quantized`` (GGML block decoding lives in ``kernels/quantization.py``)."""

from __future__ import annotations

import os

import torch

from max.engine.kernels import kernel
from max.engine.kernels import quantization as q

# The int4 CPU kernel rounds activations to bfloat16 (~1e-2 relative error);
# it is opt-in so qmatmul stays within float32 tolerance of dequantize+matmul.
_FAST = os.environ.get("LIBREMAX_QMATMUL_FAST", "0") == "1"


@kernel("dequantize")
def dequantize(blocks: torch.Tensor, encoding: str) -> torch.Tensor:
    return q.dequantize(blocks, encoding)


@kernel("qmatmul")
def qmatmul(x: torch.Tensor, blocks: torch.Tensor, encoding: str) -> torch.Tensor:
    return q.qmatmul(x, blocks, encoding, fast=_FAST)
