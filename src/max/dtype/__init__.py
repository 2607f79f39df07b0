"""Tensor element types (``max.dtype.DType``) and their limits (``finfo``)."""

from max.dtype.dtype import DType, torch_storage_dtype
from max.dtype.finfo import finfo

__all__ = ["DType", "finfo", "torch_storage_dtype"]
