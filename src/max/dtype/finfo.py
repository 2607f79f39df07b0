"""``finfo``: numerical limits of a floating-point ``DType`` (modelled on ``torch.finfo``).

Values come from ``numpy.finfo`` / ``ml_dtypes.finfo`` of the type's numpy
equivalent, so bfloat16, the float8 kinds and float4/float6 are covered too.
"""

from __future__ import annotations

from typing import Any

from max.dtype.dtype import DType


class finfo:  # noqa: N801 - reference name
    """Numerical properties of a floating-point DType.

    Attributes: ``bits``, ``eps`` (gap between 1.0 and the next value),
    ``max``, ``min`` (most negative finite value; the smallest positive one
    for unsigned kinds such as float8_e8m0fnu), ``tiny`` (smallest positive
    normal value, also ``smallest_normal``) and ``dtype``.  TypeError for a
    non-float DType.
    """

    __slots__ = ("bits", "eps", "max", "min", "tiny", "dtype")

    def __init__(self, dtype: DType) -> None:
        if not isinstance(dtype, DType):
            raise TypeError(f"finfo: expected a max.dtype.DType, got {type(dtype).__name__} {dtype!r}")
        if not dtype.is_float():
            raise TypeError(f"finfo: {dtype} is not a floating-point type (use numpy.iinfo for integers)")
        info = _np_finfo(dtype)
        self.dtype = dtype
        self.bits = int(info.bits)
        self.eps = float(info.eps)
        self.max = float(info.max)
        self.min = float(info.min)
        self.tiny = float(info.smallest_normal)

    @property
    def smallest_normal(self) -> float:
        """Alias of ``tiny`` (``torch.finfo`` compatibility)."""
        return self.tiny

    def __repr__(self) -> str:
        return (f"finfo(dtype={self.dtype}, bits={self.bits}, eps={self.eps}, max={self.max}, "
                f"min={self.min}, tiny={self.tiny})")


def _np_finfo(dtype: DType) -> Any:
    import ml_dtypes
    import numpy as np

    npd = dtype.to_numpy()
    if npd.kind == "f" and npd.type in (np.float16, np.float32, np.float64):
        return np.finfo(npd)
    return ml_dtypes.finfo(npd)
