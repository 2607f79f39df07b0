"""The ``DType`` enum: every element type a tensor can hold.

Enum values follow the reference (they are serialised by some callers).
Conversions to numpy use ``ml_dtypes`` for bfloat16, the float8 kinds and the
float4/float6 microscaling kinds, which plain numpy lacks.  torch has no dtype
for float4_e2m1fn and the float6 kinds: tensors of those types are stored as
their bit patterns in ``torch.uint8`` (:func:`torch_storage_dtype`), and
``to_torch()`` raises for them.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np


class DType(enum.Enum):
    """The tensor data type."""

    bool = 1
    float4_e2m1fn = 64
    float6_e2m3fn = 62
    float6_e3m2fn = 63
    float8_e8m0fnu = 65
    float8_e4m3fn = 66
    float8_e4m3fnuz = 67
    float8_e5m2 = 68
    float8_e5m2fnuz = 69
    float16 = 70
    bfloat16 = 71
    float32 = 72
    float64 = 73
    uint8 = 134
    int8 = 135
    uint16 = 136
    int16 = 137
    uint32 = 138
    int32 = 139
    uint64 = 140
    int64 = 141

    # ------------------------------------------------------------------ printing
    def __repr__(self) -> str:
        # As MAX prints them: repr ``float32``, str ``DType.float32``.
        return self.name

    def __str__(self) -> str:
        return f"DType.{self.name}"

    # ---------------------------------------------------------------- properties
    @property
    def size_in_bytes(self) -> int:
        """Bytes per element (``DType.float64.size_in_bytes == 8``)."""
        return _SIZE[self]

    @property
    def align(self) -> int:
        """Alignment requirement in bytes (the element size for every scalar type)."""
        return _SIZE[self]

    # ---------------------------------------------------------------- predicates
    def is_float(self) -> bool:
        """True for every floating-point type, float8 kinds included."""
        return self in _FLOATS

    def is_float8(self) -> bool:
        """True for the 8-bit float kinds."""
        return self in _FLOAT8

    def is_float4(self) -> bool:
        """True for the 4-bit float kind (float4_e2m1fn)."""
        return self is DType.float4_e2m1fn

    def is_half(self) -> bool:
        """True for float16 and bfloat16."""
        return self in (DType.float16, DType.bfloat16)

    def is_integral(self) -> bool:
        """True for signed and unsigned integer types (not bool)."""
        return self in _SIGNED or self in _UNSIGNED

    def is_signed_integral(self) -> bool:
        return self in _SIGNED

    def is_unsigned_integral(self) -> bool:
        return self in _UNSIGNED

    # ---------------------------------------------------------------- numpy
    def to_numpy(self) -> np.dtype:
        """The numpy dtype for this type (bfloat16/float8 via ``ml_dtypes``).

        Raises ValueError for a type with no numpy equivalent.
        """
        npd = _to_numpy_table().get(self)
        if npd is None:
            raise ValueError(f"DType.{self.name} has no numpy equivalent")
        return npd

    @staticmethod
    def from_numpy(dtype: Any) -> "DType":
        """The DType for a numpy dtype (or anything ``np.dtype`` accepts).

        Raises ValueError for numpy types MAX has no DType for (complex, str, object...).
        """
        try:
            npd = np.dtype(dtype)
        except TypeError as e:
            raise ValueError(f"DType.from_numpy: {dtype!r} is not a numpy dtype") from e
        for dt, cand in _to_numpy_table().items():
            if cand == npd:
                return dt
        raise ValueError(
            f"DType.from_numpy: numpy dtype {npd} is not supported; supported: "
            + ", ".join(str(v) for v in _to_numpy_table().values())
        )

    # ---------------------------------------------------------------- torch
    def to_torch(self) -> Any:
        """The ``torch.dtype`` for this type.

        Raises ValueError for float4_e2m1fn and the float6 kinds, which torch
        lacks (libremax stores them as ``torch.uint8`` bit patterns).
        """
        td = _to_torch_table().get(self)
        if td is None:
            raise ValueError(
                f"DType.{self.name} has no torch dtype; libremax stores it as uint8 bit patterns "
                "(see max.dtype.torch_storage_dtype)"
            )
        return td

    @staticmethod
    def from_torch(dtype: Any) -> "DType":
        """The DType for a ``torch.dtype``; ValueError for types MAX lacks (complex...)."""
        for dt, cand in _to_torch_table().items():
            if cand == dtype:
                return dt
        raise ValueError(f"DType.from_torch: torch dtype {dtype} is not supported")


_FLOAT8 = frozenset(
    {DType.float8_e4m3fn, DType.float8_e4m3fnuz, DType.float8_e5m2, DType.float8_e5m2fnuz, DType.float8_e8m0fnu}
)
# Types torch has no dtype for: stored as one uint8 bit pattern per element.
BIT_STORED = frozenset({DType.float4_e2m1fn, DType.float6_e2m3fn, DType.float6_e3m2fn})
_FLOATS = _FLOAT8 | BIT_STORED | {DType.float16, DType.bfloat16, DType.float32, DType.float64}
_SIGNED = frozenset({DType.int8, DType.int16, DType.int32, DType.int64})
_UNSIGNED = frozenset({DType.uint8, DType.uint16, DType.uint32, DType.uint64})
_SIZE = {
    DType.bool: 1,
    DType.float4_e2m1fn: 1,
    DType.float6_e2m3fn: 1,
    DType.float6_e3m2fn: 1,
    DType.float8_e8m0fnu: 1,
    DType.float8_e4m3fn: 1,
    DType.float8_e4m3fnuz: 1,
    DType.float8_e5m2: 1,
    DType.float8_e5m2fnuz: 1,
    DType.float16: 2,
    DType.bfloat16: 2,
    DType.float32: 4,
    DType.float64: 8,
    DType.uint8: 1,
    DType.int8: 1,
    DType.uint16: 2,
    DType.int16: 2,
    DType.uint32: 4,
    DType.int32: 4,
    DType.uint64: 8,
    DType.int64: 8,
}

_NP_TABLE: dict | None = None
_TORCH_TABLE: dict | None = None


def _to_numpy_table() -> dict:
    global _NP_TABLE
    if _NP_TABLE is None:
        import ml_dtypes

        table = {
            DType.bool: np.dtype(np.bool_),
            DType.float16: np.dtype(np.float16),
            DType.float32: np.dtype(np.float32),
            DType.float64: np.dtype(np.float64),
            DType.uint8: np.dtype(np.uint8),
            DType.int8: np.dtype(np.int8),
            DType.uint16: np.dtype(np.uint16),
            DType.int16: np.dtype(np.int16),
            DType.uint32: np.dtype(np.uint32),
            DType.int32: np.dtype(np.int32),
            DType.uint64: np.dtype(np.uint64),
            DType.int64: np.dtype(np.int64),
            DType.bfloat16: np.dtype(ml_dtypes.bfloat16),
            DType.float8_e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn),
            DType.float8_e4m3fnuz: np.dtype(ml_dtypes.float8_e4m3fnuz),
            DType.float8_e5m2: np.dtype(ml_dtypes.float8_e5m2),
            DType.float8_e5m2fnuz: np.dtype(ml_dtypes.float8_e5m2fnuz),
        }
        for dt in (DType.float4_e2m1fn, DType.float6_e2m3fn, DType.float6_e3m2fn, DType.float8_e8m0fnu):
            npt = getattr(ml_dtypes, dt.name, None)  # older ml_dtypes lack the microscaling types
            if npt is not None:
                table[dt] = np.dtype(npt)
        _NP_TABLE = table
    return _NP_TABLE


def _to_torch_table() -> dict:
    global _TORCH_TABLE
    if _TORCH_TABLE is None:
        import torch

        _TORCH_TABLE = {
            DType.bool: torch.bool,
            DType.float8_e4m3fn: torch.float8_e4m3fn,
            DType.float8_e4m3fnuz: torch.float8_e4m3fnuz,
            DType.float8_e5m2: torch.float8_e5m2,
            DType.float8_e5m2fnuz: torch.float8_e5m2fnuz,
            DType.float8_e8m0fnu: getattr(torch, "float8_e8m0fnu", None),
            DType.float16: torch.float16,
            DType.bfloat16: torch.bfloat16,
            DType.float32: torch.float32,
            DType.float64: torch.float64,
            DType.uint8: torch.uint8,
            DType.int8: torch.int8,
            DType.uint16: torch.uint16,
            DType.int16: torch.int16,
            DType.uint32: torch.uint32,
            DType.int32: torch.int32,
            DType.uint64: torch.uint64,
            DType.int64: torch.int64,
        }
        _TORCH_TABLE = {k: v for k, v in _TORCH_TABLE.items() if v is not None}
    return _TORCH_TABLE


def torch_storage_dtype(dtype: DType) -> Any:
    """The ``torch.dtype`` a tensor of ``dtype`` is stored as (uint8 for the bit-stored types)."""
    td = _to_torch_table().get(dtype)
    if td is None:
        import torch

        return torch.uint8
    return td
