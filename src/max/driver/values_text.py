"""The text of an array's values, as MAX prints tensors (eager ``Tensor`` repr, ``F.print``).

Cells: floats as ``'{:.4g}'`` (``1``, ``1.235``, ``-0``, ``1.235e-05``, ``nan``,
``inf``), integers and bools as ``str``; every cell right-aligned to the widest
cell of the whole array and joined by one space.  Nothing is elided.

* rank 0: the cell alone (``42.5``);
* rank 1: ``[1 2 3]``; an array with no elements is ``[]``;
* rank 2: rows joined by ``"\\n "`` (``[-1  2\\n  3 -4]``);
* rank 3 ``[A, R, C]``: the A matrices side by side, row by row, joined by
  ``" | "`` (``[1 2 | 5 6\\n 3 4 | 7 8]``);
* rank 4 and up: the rank-3 blocks one under the other, separated by a blank
  line (two for rank 5, ...).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["values_text"]


def _cells(a: np.ndarray) -> np.ndarray:
    """Each element's text (an object array of ``a``'s shape)."""
    if a.dtype.kind == "f":
        fmt = "{:.4g}".format
        return np.vectorize(lambda v: fmt(float(v)), otypes=[object])(a) if a.size else a.astype(object)
    return np.vectorize(lambda v: str(v.item() if hasattr(v, "item") else v), otypes=[object])(a) \
        if a.size else a.astype(object)


def _lines(cells: np.ndarray) -> list[str]:
    """The lines of a rank >= 1 array of (already padded) cells."""
    if cells.ndim == 1:
        return [" ".join(cells)]
    if cells.ndim == 2:
        return [" ".join(row) for row in cells]
    if cells.ndim == 3:
        return [" | ".join(" ".join(m[r]) for m in cells) for r in range(cells.shape[1])]
    gap = [""] * (cells.ndim - 3)
    out: list[str] = []
    for i, block in enumerate(cells):
        if i:
            out.extend(gap)
        out.extend(_lines(block))
    return out


def values_text(array: Any) -> str:
    """``array``'s values as MAX prints them (a numpy array, or anything ``np.asarray`` takes;
    float types numpy lacks, such as bfloat16, should be widened to float32 first)."""
    a = np.asarray(array)
    if a.ndim == 0:
        return _cells(a).item()
    if a.size == 0:
        return "[]"
    cells = _cells(a)
    width = max(len(c) for c in cells.flat)
    padded = np.vectorize(lambda c: c.rjust(width), otypes=[object])(cells)
    return "[" + "\n ".join(_lines(padded)) + "]"
