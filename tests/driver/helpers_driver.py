"""Helpers shared by the driver tests."""

import numpy as np
import pytest
import torch

from max.dtype import DType

requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an accelerator")

ALL_DTYPES = list(DType)


def bits(arr: np.ndarray) -> np.ndarray:
    """The raw bits of an array as unsigned ints (so NaNs and bf16/fp8 compare exactly)."""
    arr = np.asarray(arr)
    return arr.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[arr.dtype.itemsize])


def sample_array(dtype: DType, shape) -> np.ndarray:
    """Distinct-ish values of ``dtype`` in ``shape``."""
    n = int(np.prod(shape)) if len(shape) else 1
    base = np.arange(n, dtype=np.int64)
    if dtype is DType.bool:
        vals = (base % 2).astype(bool)
    elif dtype.is_float():
        vals = ((base % 97) - 40).astype(np.float32).astype(dtype.to_numpy())
    elif dtype.is_unsigned_integral():
        vals = (base % 200).astype(dtype.to_numpy())
    else:
        vals = ((base % 200) - 100).astype(dtype.to_numpy())
    return vals.reshape(shape)
