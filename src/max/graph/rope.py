"""RoPE's inverse frequencies: the one formula every rotary table starts from.

``max.nn.rotary_embedding`` (and its scalings, ``rope_from_hf``), ``max.experimental.nn.rope`` and the
families' own tables (Qwen2.5-VL / Pixtral / Llama 4 vision towers, Mimi) all take
:func:`rope_inv_freq`.  It lives on the graph floor so that both the eager layers (``experimental``) and
the graph-building ones (``nn``, ``pipelines``) can import it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["rope_inv_freq"]


def rope_inv_freq(theta: float, dim: int, dtype: Any = np.float64) -> np.ndarray:
    """``theta ** (-2i / dim)`` for ``i = 0 .. dim / 2 - 1`` (``[dim // 2]``), computed in ``dtype``:
    float64 for libremax's own tables; float32 where the checkpoint's reference computes them in float32
    (transformers' vision towers, Mimi), so that the angles round as they do there."""
    dt = np.dtype(dtype)
    return (1.0 / (dt.type(theta) ** (np.arange(0, dim, 2, dtype=dt) / dt.type(dim)))).astype(dt)
