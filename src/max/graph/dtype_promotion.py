"""MAX's dtype promotion rules, used by every op that combines operands.

Two *strong* dtypes (tensor operands) promote to one of themselves, never to
a new wider type:

1. rank each dtype by category (``bool < unsigned int < signed int < float``)
   and bit width;
2. the result is the input dtype with the highest category and the largest
   bit width (``int8`` with ``float16`` gives ``float16``);
3. every input must be exactly representable in the result, else ValueError
   with MAX's text ``Failed to resolve valid dtype: Unsafe cast from ui8 to
   si8. Insert an explicit cast op if this conversion is wanted.`` (``uint8``
   with ``int8``: ``int8`` cannot hold 255; ``int32`` with ``float32``:
   ``float32`` cannot hold every int32; ``float32`` with ``int64``: the common
   type would be a 64-bit float, which cannot hold every int64).

Python and numpy scalars are *weak*: they take the other operand's dtype when
their value fits it (``int_tensor + 2`` stays an int tensor, ``x_f16 * 0.5``
stays float16) and raise ValueError when it does not (``int_tensor + 1.5``,
``uint8_tensor + 300``, ``bool_tensor + 2``), with MAX's texts ``Unsafe cast:
Can't promote python int with value (300) to dtype(DType.uint8). It would lose
precision.`` and ``Unsafe cast: Can't promote python float to
dtype(DType.int32).``  An integer scalar must be exactly representable in a
float dtype; any float scalar takes a float dtype (rounded like any literal:
``x_f16 + 1e300`` is ``inf``, as in MAX); for an integer dtype a float scalar
must be a whole number in range.
"""

from __future__ import annotations

import math
import numbers
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from max.dtype import DType

__all__ = [
    "category",
    "bitwidth",
    "is_safely_representable",
    "promote",
    "promote_dtypes",
    "is_weak_scalar",
    "weak_scalar_fits",
    "check_weak_scalar",
    "weak_scalar_error",
    "mlir_name",
    "result_dtype",
]

_CATEGORIES = ("bool", "unsigned", "signed", "float")


def category(dtype: DType) -> int:
    """0 for bool, 1 for unsigned ints, 2 for signed ints, 3 for floats."""
    if dtype is DType.bool:
        return 0
    if dtype.is_unsigned_integral():
        return 1
    if dtype.is_signed_integral():
        return 2
    return 3


def bitwidth(dtype: DType) -> int:
    """Bits per element (1 for bool, 4 for float4, 6 for the float6 kinds)."""
    if dtype is DType.bool:
        return 1
    if dtype is DType.float4_e2m1fn:
        return 4
    if dtype in (DType.float6_e2m3fn, DType.float6_e3m2fn):
        return 6
    return dtype.size_in_bytes * 8


class _FloatProps(NamedTuple):
    precision: int  # significand bits, the implicit one included
    emin: int  # exponent of the smallest normal value
    emax: int  # exponent of the largest finite value
    sub_exp: int  # log2 of the smallest positive value
    max: float
    has_inf: bool
    has_nan: bool
    signed: bool
    has_zero: bool


@lru_cache(maxsize=None)
def _float_props(dtype: DType) -> _FloatProps:
    from max.dtype import finfo
    from max.dtype.finfo import _np_finfo

    info = _np_finfo(dtype)
    npd = dtype.to_numpy()
    with np.errstate(all="ignore"):
        inf = np.array([np.inf], dtype=np.float32).astype(npd).astype(np.float64)[0]
        nan = np.array([np.nan], dtype=np.float32).astype(npd).astype(np.float64)[0]
        zero = np.array([0.0], dtype=np.float32).astype(npd).astype(np.float64)[0]
    f = finfo(dtype)
    return _FloatProps(
        precision=int(info.nmant) + 1,
        emin=int(info.minexp),
        emax=int(info.maxexp) - 1,
        sub_exp=int(round(math.log2(float(info.smallest_subnormal)))),
        max=f.max,
        has_inf=bool(np.isinf(inf)),
        has_nan=bool(np.isnan(nan)),
        signed=f.min < 0,
        has_zero=bool(zero == 0.0),
    )


def _int_range(dtype: DType) -> tuple[int, int]:
    if dtype is DType.bool:
        return 0, 1
    info = np.iinfo(dtype.to_numpy())
    return int(info.min), int(info.max)


def is_safely_representable(src: DType, dst: DType) -> bool:
    """Whether every value of ``src`` is exactly representable in ``dst``."""
    if src is dst:
        return True
    cs, cd = category(src), category(dst)
    if cd < 3:  # integer or bool destination: only narrower-range integers fit
        if cs == 3:
            return False
        lo, hi = _int_range(src)
        dlo, dhi = _int_range(dst)
        return dlo <= lo and hi <= dhi
    d = _float_props(dst)
    if cs < 3:  # integer -> float: the magnitude bits must fit the significand
        lo, hi = _int_range(src)
        if not d.has_zero or (lo < 0 and not d.signed):
            return False
        mag = max(hi, -lo)  # every integer up to 2**precision is exact
        return mag <= d.max and mag <= 1 << d.precision
    s = _float_props(src)
    return (
        d.precision >= s.precision
        and d.emax >= s.emax
        and d.max >= s.max
        and d.sub_exp <= s.sub_exp
        and (d.has_inf or not s.has_inf)
        and (d.has_nan or not s.has_nan)
        and (d.signed or not s.signed)
        and (d.has_zero or not s.has_zero)
    )


def promote(a: DType, b: DType, op: str | None = None) -> DType:
    """The common dtype of two strong dtypes (one of them), or ValueError."""
    return promote_dtypes(a, b, op=op)


_MLIR_FLOAT = {
    DType.float16: "f16", DType.bfloat16: "bf16", DType.float32: "f32", DType.float64: "f64",
    DType.float8_e4m3fn: "f8E4M3FN", DType.float8_e4m3fnuz: "f8E4M3FNUZ", DType.float8_e5m2: "f8E5M2",
    DType.float8_e5m2fnuz: "f8E5M2FNUZ", DType.float8_e8m0fnu: "f8E8M0FNU", DType.float4_e2m1fn: "f4E2M1FN",
    DType.float6_e2m3fn: "f6E2M3FN", DType.float6_e3m2fn: "f6E3M2FN",
}


def mlir_name(dtype: DType) -> str:
    """The element-type name MAX's messages use: ``i1``, ``ui16``, ``si64``, ``f16``, ``bf16``."""
    if dtype is DType.bool:
        return "i1"
    if dtype in _MLIR_FLOAT:
        return _MLIR_FLOAT[dtype]
    return ("ui" if dtype.is_unsigned_integral() else "si") + str(bitwidth(dtype))


_STANDARD = {
    (0, 1): DType.bool, (1, 8): DType.uint8, (1, 16): DType.uint16, (1, 32): DType.uint32, (1, 64): DType.uint64,
    (2, 8): DType.int8, (2, 16): DType.int16, (2, 32): DType.int32, (2, 64): DType.int64,
    (3, 16): DType.float16, (3, 32): DType.float32, (3, 64): DType.float64,
}


def _category_name(cat: int, bits: int) -> str:
    return ("i" if cat == 0 else "ui" if cat == 1 else "si" if cat == 2 else "f") + str(bits)


def promotion_error(dtypes: "tuple[DType, ...] | list[DType]") -> str | None:
    """MAX's diagnostic when ``dtypes`` have no common type, else None."""
    try:
        promote_dtypes(*dtypes)
    except ValueError as e:
        return str(e)
    return None


def promote_dtypes(*dtypes: DType, op: str | None = None) -> DType:
    """The common dtype of strong ``dtypes`` under MAX's rules (see the module docstring).

    ValueError ``Failed to resolve valid dtype: Unsafe cast from <src> to <target>. Insert an
    explicit cast op if this conversion is wanted.`` when an input does not fit the common type
    (``op`` is named after that text)."""
    if not dtypes:
        raise ValueError("promote_dtypes: needs at least one dtype")
    for d in dtypes:
        if not isinstance(d, DType):
            raise TypeError(f"{op or 'promote_dtypes'}: expected DType values, got {type(d).__name__} {d!r}")
    first = dtypes[0]
    if all(d is first for d in dtypes):
        return first
    cat = max(category(d) for d in dtypes)
    bits = max(bitwidth(d) for d in dtypes)
    cands = list(dict.fromkeys(d for d in dtypes if category(d) == cat and bitwidth(d) == bits))
    for target in cands:
        if all(is_safely_representable(d, target) for d in dtypes):
            return target
    target = cands[0] if cands else _STANDARD.get((cat, bits))
    target_name = mlir_name(target) if target is not None else _category_name(cat, bits)
    bad = next((d for d in dtypes if target is None or not is_safely_representable(d, target)), dtypes[0])
    msg = (f"Failed to resolve valid dtype: Unsafe cast from {mlir_name(bad)} to {target_name}. "
           "Insert an explicit cast op if this conversion is wanted.")
    raise ValueError(f"{msg} ({op})" if op else msg)


# ----------------------------------------------------------------------------- weak scalars
def is_weak_scalar(x: Any) -> bool:
    """Python bool/int/float and numpy scalars (not arrays, not tensors)."""
    return isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating))


def weak_scalar_fits(value: Any, dtype: DType) -> bool:
    """Whether the weak scalar ``value`` can take ``dtype`` (see the module docstring)."""
    if isinstance(value, (bool, np.bool_)):
        value = int(value)
        if dtype is DType.bool:
            return True
    if isinstance(value, (int, np.integer)):
        v = int(value)
        if category(dtype) < 3:
            lo, hi = _int_range(dtype)
            return lo <= v <= hi
        p = _float_props(dtype)
        if v == 0:
            return p.has_zero
        if v < 0 and not p.signed:
            return False
        mag = abs(v)
        if mag > p.max:
            return False
        # exactly representable: the significant bits fit the significand
        stripped = mag >> ((mag & -mag).bit_length() - 1)
        return stripped.bit_length() <= p.precision and mag.bit_length() - 1 >= p.sub_exp
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if category(dtype) < 3:
            if not math.isfinite(v) or v != int(v):
                return False
            return weak_scalar_fits(int(v), dtype)
        # any float takes a float dtype, rounded like a literal (MAX: x_f16 + 1e300 is inf)
        return True
    if isinstance(value, numbers.Number):
        return False
    raise TypeError(f"weak_scalar_fits: {type(value).__name__} is not a scalar")


def weak_scalar_error(value: Any, dtype: DType) -> str:
    """MAX's text for a weak scalar that does not fit ``dtype``."""
    if isinstance(value, (float, np.floating)):
        return f"Unsafe cast: Can't promote python float to dtype({dtype})."
    return f"Unsafe cast: Can't promote python int with value ({int(value)}) to dtype({dtype}). It would lose precision."


def check_weak_scalar(value: Any, dtype: DType, op: str | None = None, arg: str = "scalar") -> None:
    """ValueError with MAX's text (``Unsafe cast: Can't promote python int with value (1000) to
    dtype(DType.int8). It would lose precision.``), then ``op`` and ``arg``, unless weak scalar
    ``value`` fits ``dtype``."""
    if not weak_scalar_fits(value, dtype):
        where = f" ({op}: {arg}={value!r})" if op else ""
        raise ValueError(weak_scalar_error(value, dtype) + where)


def result_dtype(*operands: Any, op: str | None = None) -> DType:
    """The dtype an elementwise op computes in for ``operands`` (DTypes, values with a
    ``.dtype``, or weak scalars).  Weak scalars adopt the strong operands' common dtype."""
    strong = []
    weak = []
    for x in operands:
        if isinstance(x, DType):
            strong.append(x)
        elif is_weak_scalar(x):
            weak.append(x)
        elif isinstance(getattr(x, "dtype", None), DType):
            strong.append(x.dtype)
        else:
            raise TypeError(f"{op or 'result_dtype'}: cannot take the dtype of {type(x).__name__}")
    if not strong:
        if any(isinstance(w, (float, np.floating)) for w in weak):
            return DType.float32
        if any(isinstance(w, (int, np.integer)) and not isinstance(w, (bool, np.bool_)) for w in weak):
            return DType.int64
        return DType.bool
    dt = promote_dtypes(*strong, op=op)
    for w in weak:
        check_weak_scalar(w, dt, op)
    return dt
