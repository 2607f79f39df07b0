"""Kernels for ``max.graph.ops.debug``."""

from __future__ import annotations

import builtins
import os
import sys

import numpy as np
import torch

from max.engine.kernels import kernel

_NUMPY_OK = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.float32, torch.float64,
}


# set by InferenceSession.set_debug_print_options (PrintStyle values)
OPTIONS: dict = {"style": "COMPACT", "precision": 6, "directory": None}


@kernel("print", pure=False)
def print_(*ts: torch.Tensor, label: str = "debug_tensor", text: str | None = None) -> None:
    style = OPTIONS["style"]
    if style == "NONE":
        return None
    if text is not None:
        builtins.print(text, file=sys.stdout, flush=True)
        return None
    t = ts[0].detach()
    if style == "BINARY_MAX_CHECKPOINT":
        from max.driver.buffer import Buffer
        from max.driver.checkpoint import write_max_buffer

        buf = Buffer._from_torch(t.cpu().contiguous())
        os.makedirs(OPTIONS["directory"], exist_ok=True)
        write_max_buffer(os.path.join(OPTIONS["directory"], f"{label}.max"), buf.to_numpy(), buf.dtype)
        return None
    if t.dtype not in _NUMPY_OK:
        t = t.to(torch.float32)
    arr = t.cpu().numpy()
    if style == "BINARY":
        os.makedirs(OPTIONS["directory"], exist_ok=True)
        np.save(os.path.join(OPTIONS["directory"], f"{label}.npy"), arr)
        return None
    threshold = sys.maxsize if style == "FULL" else 1000
    body = np.array2string(arr, separator=", ", precision=OPTIONS["precision"], threshold=threshold)
    builtins.print(f"{label}: {body}", file=sys.stdout, flush=True)
    return None
