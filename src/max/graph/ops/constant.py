"""Constants and external constants."""

from __future__ import annotations

from typing import Any

import numpy as np

from max.dtype import DType
from max.graph.ops._common import as_device_ref, fail, stage1
from max.graph.type import TensorType
from max.graph.value import TensorValue


def _check_fits(arr: np.ndarray, dtype: DType, op: str) -> None:
    if arr.size == 0:
        return
    if dtype.is_integral() or dtype is DType.bool:
        if arr.dtype.kind == "f":
            if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
                bad = arr[~(np.isfinite(arr) & (arr == np.round(arr)))].reshape(-1)[0]
                fail(op, f"value {bad!r} does not fit {dtype} (not a whole number)")
        if dtype is DType.bool:
            if arr.dtype != np.bool_ and not np.all((arr == 0) | (arr == 1)):
                fail(op, f"values of {arr.dtype} do not fit {dtype} (only 0/1 or True/False)")
            return
        info = np.iinfo(dtype.to_numpy())
        lo, hi = arr.min(), arr.max()
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            fail(op, f"value {bad} does not fit {dtype} (range {info.min}..{info.max})")
    elif dtype.is_float() and arr.dtype.kind in "iuf":
        finite = np.isfinite(arr) if arr.dtype.kind == "f" else np.ones(arr.shape, bool)
        try:
            limit = float(np.finfo(dtype.to_numpy()).max)
        except ValueError:
            return
        big = np.abs(arr[finite].astype(np.float64)) > limit if finite.any() else np.zeros(0, bool)
        if big.any():
            bad = arr[finite][big].reshape(-1)[0]
            fail(op, f"value {bad} does not fit {dtype} (max {limit:g})")


def constant(value: Any, dtype: DType | None = None, device: Any = None) -> TensorValue:
    """A tensor holding ``value``: its shape is the value's shape (a scalar gives rank 0).

    Raises ValueError when a value does not fit ``dtype`` (precision loss is allowed).
    """
    op = "constant"
    if dtype is None:
        fail(op, "dtype is required (e.g. DType.float32)", TypeError)
    if not isinstance(dtype, DType):
        fail(op, f"dtype must be a DType, got {type(dtype).__name__} {dtype!r}", TypeError)
    dev = as_device_ref(device, op)
    if hasattr(value, "__dlpack__") and not isinstance(value, np.ndarray):
        import torch

        value = torch.from_dlpack(value).cpu().numpy() if not hasattr(value, "to_numpy") else value.to_numpy()
    try:
        arr = np.asarray(value)
    except Exception as e:  # pragma: no cover - numpy error text is clear enough
        fail(op, f"cannot convert {type(value).__name__} to an array: {e}", TypeError)
    if arr.dtype == object or arr.dtype.kind not in "biuf" and not (
        arr.dtype.kind == "V" or str(arr.dtype) in ("bfloat16",) or "float8" in str(arr.dtype)
    ):
        fail(op, f"value must be numeric (bool/int/float), got {arr.dtype}", TypeError)
    _check_fits(arr, dtype, op)
    if dtype.is_float8() or dtype is DType.bfloat16:
        stored = arr.astype(np.float32).astype(dtype.to_numpy())
    else:
        with np.errstate(all="ignore"):
            stored = arr.astype(dtype.to_numpy())
    if not stored.flags.c_contiguous:
        stored = stored.copy(order="C")
    stored.setflags(write=False)
    return stage1(op, (), TensorType(dtype, stored.shape, dev), {"value": stored})


def constant_external(name: str, type: TensorType) -> TensorValue:
    """An external constant (a weight) named ``name`` of the given type."""
    from max.graph.weight import Weight

    if not isinstance(type, TensorType):
        fail("constant_external", f"type must be a TensorType, got {type!r}", TypeError)
    return Weight(name, type.dtype, type.shape, type.device)._bound()
