"""Kernels for ``max.graph.ops.debug``."""

from __future__ import annotations

import builtins
import sys

import numpy as np
import torch

from max.engine.kernels import kernel

_NUMPY_OK = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.float32, torch.float64,
}


@kernel("print", pure=False)
def print_(*ts: torch.Tensor, label: str = "debug_tensor", text: str | None = None) -> None:
    if text is not None:
        builtins.print(text, file=sys.stdout, flush=True)
        return None
    t = ts[0].detach()
    if t.dtype not in _NUMPY_OK:
        t = t.to(torch.float32)
    arr = t.cpu().numpy()
    builtins.print(f"{label}: {np.array2string(arr, separator=', ')}", file=sys.stdout, flush=True)
    return None
