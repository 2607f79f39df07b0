"""MAX's dtype promotion rules (max.graph.dtype_promotion) and their use by the ops.

References: representability is checked by brute force over every bit pattern
of the 8- and 16-bit types (numpy/ml_dtypes round trips), and by the exact
integer limits of float significands for the wide types.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, ops
from max.graph import dtype_promotion as dp
from support import run1, tt

ALL = [d for d in DType]
NARROW = [d for d in DType if d.size_in_bytes <= 2 and d is not DType.bool]


def CPU(dt, shape, _dev=None):  # noqa: N802
    return TensorType(dt, shape, DeviceRef.CPU())


def _all_values(dt: DType) -> np.ndarray:
    """Every value of an 8/16-bit dtype (as float64), from all bit patterns."""
    npd = dt.to_numpy()
    bits = np.arange(2 ** (8 * npd.itemsize), dtype=np.uint16 if npd.itemsize == 2 else np.uint8)
    vals = bits.view(npd) if npd.itemsize == bits.dtype.itemsize else bits.astype(npd)
    with np.errstate(all="ignore"):
        return vals.astype(np.float64)


def _brute_representable(src: DType, dst: DType) -> bool:
    vals = _all_values(src) if src is not DType.bool else np.array([0.0, 1.0])
    with np.errstate(all="ignore"):
        back = vals.astype(dst.to_numpy()).astype(np.float64)
    same = (back == vals) | (np.isnan(back) & np.isnan(vals))
    return bool(same.all())


@pytest.mark.parametrize("src,dst", [(a, b) for a in NARROW + [DType.bool] for b in NARROW + [DType.bool]
                                     if a.to_numpy().itemsize == 1 or b.size_in_bytes <= 2],
                         ids=lambda d: d.name)
def test_representability_matches_brute_force(src, dst):
    assert dp.is_safely_representable(src, dst) == _brute_representable(src, dst)


@pytest.mark.parametrize("src,dst,ok", [
    (DType.int32, DType.float32, False), (DType.int16, DType.float32, True),
    (DType.int32, DType.float64, True), (DType.int64, DType.float64, False),
    (DType.uint32, DType.int64, True), (DType.uint64, DType.int64, False),
    (DType.float32, DType.float64, True), (DType.float64, DType.float32, False),
    (DType.bfloat16, DType.float32, True), (DType.float16, DType.float32, True),
    (DType.float32, DType.int64, False), (DType.bool, DType.float32, True),
])
def test_representability_wide(src, dst, ok):
    assert dp.is_safely_representable(src, dst) is ok


@given(st.sampled_from(ALL), st.sampled_from(ALL))
def test_promotion_properties(a, b):
    top = (max(dp.category(a), dp.category(b)), max(dp.bitwidth(a), dp.bitwidth(b)))
    valid = [c for c in (a, b) if (dp.category(c), dp.bitwidth(c)) == top
             and dp.is_safely_representable(a, c) and dp.is_safely_representable(b, c)]
    try:
        r = dp.promote(a, b)
    except ValueError:
        assert not valid  # an error only when no input is a valid common type
        with pytest.raises(ValueError):
            dp.promote(b, a)
        return
    assert r in valid
    assert r in (a, b)  # never a new, wider type
    assert dp.promote(b, a) is r  # symmetric
    assert dp.is_safely_representable(a, r) and dp.is_safely_representable(b, r)
    assert dp.category(r) == max(dp.category(a), dp.category(b))
    assert dp.bitwidth(r) == max(dp.bitwidth(a), dp.bitwidth(b))


@pytest.mark.parametrize("a,b,want", [
    (DType.int8, DType.float16, DType.float16), (DType.uint8, DType.int16, DType.int16),
    (DType.bool, DType.int32, DType.int32), (DType.float16, DType.float32, DType.float32),
    (DType.int32, DType.int64, DType.int64), (DType.float8_e4m3fn, DType.bfloat16, DType.bfloat16),
    (DType.uint8, DType.int8, None), (DType.float32, DType.int32, None), (DType.float32, DType.int64, None),
    (DType.float16, DType.bfloat16, None), (DType.uint64, DType.int64, None), (DType.int16, DType.float16, None),
])
def test_promotion_table(a, b, want):
    if want is None:
        with pytest.raises(ValueError, match="^Failed to resolve valid dtype: Unsafe cast from "):
            dp.promote(a, b)
    else:
        assert dp.promote(a, b) is want


@pytest.mark.parametrize("value,dtype,ok", [
    (2, DType.int32, True), (1.5, DType.int32, False), (2.0, DType.int32, True), (300, DType.uint8, False),
    (-1, DType.uint8, False), (255, DType.uint8, True), (True, DType.bool, True), (1, DType.bool, True),
    (2, DType.bool, False), (0.5, DType.bool, False), (16777216, DType.float32, True),
    (16777217, DType.float32, False), (0.1, DType.float32, True), (70000.0, DType.float16, True),
    (65504.0, DType.float16, True), (float("inf"), DType.float32, True), (float("inf"), DType.float8_e4m3fn, True),
    (float("nan"), DType.float16, True), (np.float64(0.5), DType.float16, True), (np.int64(7), DType.int8, True),
    (np.int64(700), DType.int8, False),
])
def test_weak_scalar_fits(value, dtype, ok):
    assert dp.weak_scalar_fits(value, dtype) is ok


@given(st.integers(-2**70, 2**70), st.sampled_from([d for d in DType if d is not DType.bool and not
                                                   (d.is_float() and d.size_in_bytes == 1)]))
def test_weak_int_fits_matches_exact_conversion(v, dt):
    fits = dp.weak_scalar_fits(v, dt)
    if dt.is_float():
        with np.errstate(all="ignore"):
            ref = abs(v) < 2**1000 and np.isfinite(np.float64(dt.to_numpy().type(float(v)))) and \
                int(np.array(float(v)).astype(dt.to_numpy()).astype(np.float64).item()) == v and float(v) == v
        assert fits == bool(ref)
    else:
        info = np.iinfo(dt.to_numpy())
        assert fits == (int(info.min) <= v <= int(info.max))


# ----------------------------------------------------------------------------- in ops
def _build(fn, *types):
    return Graph("g", fn, input_types=list(types))


def test_ops_reject_float32_plus_int32():
    with pytest.raises(ValueError, match=r"Failed to create op 'AddOp'(.|\n)*Unsafe cast from si32 to f32"):
        _build(lambda a, b: a + b, CPU(DType.float32, [2], "cpu"), CPU(DType.int32, [2], "cpu"))


def test_ops_reject_int_tensor_plus_fraction():
    with pytest.raises(ValueError, match=r"^Unsafe cast: Can't promote python float to dtype\(DType\.int32\)\."):
        _build(lambda a: a + 1.5, CPU(DType.int32, [2], "cpu"))
    with pytest.raises(ValueError, match=r"^Unsafe cast: Can't promote python int with value \(300\) to dtype\(DType\.uint8\)\. "
                                         r"It would lose precision\. \(mul: lhs=300\)"):
        _build(lambda a: 300 * a, CPU(DType.uint8, [2], "cpu"))


@pytest.mark.parametrize("opname", ["where", "concat", "matmul", "max", "outer"])
def test_other_ops_promote_or_reject_with_value_error(opname):
    f32, i32 = CPU(DType.float32, [2, 2], "cpu"), CPU(DType.int32, [2, 2], "cpu")
    calls = {
        "where": lambda a, b: ops.where(ops.greater(a, 0.0), a, b),
        "concat": lambda a, b: ops.concat([a, b]),
        "matmul": lambda a, b: ops.matmul(a, b),
        "max": lambda a, b: ops.max(a, b),
        "outer": lambda a, b: ops.outer(a, b),
    }
    with pytest.raises(ValueError, match="concat:" if opname == "concat" else "Unsafe cast from si32 to f32"):
        _build(calls[opname], f32, i32)


def test_weak_scalars_keep_the_tensor_dtype_and_values():
    a = np.arange(6, dtype=np.float16).reshape(2, 3)
    out = run1(lambda x: x * 0.5 + 2, [tt(DType.float16, [2, 3])], a)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, (a.astype(np.float64) * 0.5 + 2).astype(np.float16))
    i = np.arange(6, dtype=np.int32)
    out = run1(lambda x: (x + 2.0) * 3, [tt(DType.int32, [6])], i)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, (i + 2) * 3)
    b = np.array([True, False])
    out = run1(lambda x: ops.logical_and(x, True), [tt(DType.bool, [2])], b)
    np.testing.assert_array_equal(out, b)


@given(st.sampled_from([(DType.int8, DType.float16), (DType.uint8, DType.int16), (DType.int16, DType.int64),
                        (DType.float16, DType.float32), (DType.bool, DType.int32)]))
def test_mixed_tensor_promotion_values(pair):
    lo, hi = pair
    a = np.array([0, 1, 3, 7], dtype=lo.to_numpy())
    b = np.array([1, 2, 2, 5], dtype=hi.to_numpy())
    out = run1(lambda x, y: x + y, [tt(lo, [4]), tt(hi, [4])], a, b)
    assert out.dtype == hi.to_numpy()
    np.testing.assert_array_equal(out, a.astype(np.float64) + b.astype(np.float64))


def test_result_dtype_helper():
    assert dp.result_dtype(DType.int32, 2) is DType.int32
    assert dp.result_dtype(1.0, 2) is DType.float32
    with pytest.raises(ValueError):
        dp.result_dtype(DType.int32, 0.25)
    assert dp.promote_dtypes(DType.int8, DType.int16, DType.int32) is DType.int32
