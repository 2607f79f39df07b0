"""Tensor element types (``max.dtype.DType``)."""

from max.dtype.dtype import DType

__all__ = ["DType"]
