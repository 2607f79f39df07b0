"""The DType enum: values, sizes, predicates and numpy/torch conversions."""

import ml_dtypes
import numpy as np
import pytest
import torch

from max.dtype import DType, finfo, torch_storage_dtype

# (member, enum value, bytes, numpy dtype, torch dtype)
TABLE = [
    (DType.bool, 1, 1, np.bool_, torch.bool),
    (DType.float4_e2m1fn, 64, 1, ml_dtypes.float4_e2m1fn, None),
    (DType.float6_e2m3fn, 62, 1, ml_dtypes.float6_e2m3fn, None),
    (DType.float6_e3m2fn, 63, 1, ml_dtypes.float6_e3m2fn, None),
    (DType.float8_e8m0fnu, 65, 1, ml_dtypes.float8_e8m0fnu, torch.float8_e8m0fnu),
    (DType.float8_e4m3fn, 66, 1, ml_dtypes.float8_e4m3fn, torch.float8_e4m3fn),
    (DType.float8_e4m3fnuz, 67, 1, ml_dtypes.float8_e4m3fnuz, torch.float8_e4m3fnuz),
    (DType.float8_e5m2, 68, 1, ml_dtypes.float8_e5m2, torch.float8_e5m2),
    (DType.float8_e5m2fnuz, 69, 1, ml_dtypes.float8_e5m2fnuz, torch.float8_e5m2fnuz),
    (DType.float16, 70, 2, np.float16, torch.float16),
    (DType.bfloat16, 71, 2, ml_dtypes.bfloat16, torch.bfloat16),
    (DType.float32, 72, 4, np.float32, torch.float32),
    (DType.float64, 73, 8, np.float64, torch.float64),
    (DType.uint8, 134, 1, np.uint8, torch.uint8),
    (DType.int8, 135, 1, np.int8, torch.int8),
    (DType.uint16, 136, 2, np.uint16, torch.uint16),
    (DType.int16, 137, 2, np.int16, torch.int16),
    (DType.uint32, 138, 4, np.uint32, torch.uint32),
    (DType.int32, 139, 4, np.int32, torch.int32),
    (DType.uint64, 140, 8, np.uint64, torch.uint64),
    (DType.int64, 141, 8, np.int64, torch.int64),
]
IDS = [row[0].name for row in TABLE]


def test_table_covers_every_member():
    assert [row[0] for row in TABLE] == list(DType)
    assert len(DType) == 21


@pytest.mark.parametrize("dt,value,size,npd,td", TABLE, ids=IDS)
def test_member(dt, value, size, npd, td):
    assert dt.value == value
    assert DType(value) is dt
    assert dt.size_in_bytes == size
    assert dt.align == size
    assert dt.to_numpy() == np.dtype(npd)
    assert DType.from_numpy(npd) is dt
    assert DType.from_numpy(np.dtype(npd)) is dt
    assert DType.from_numpy(dt.to_numpy()) is dt
    assert np.dtype(npd).itemsize == size
    if td is None:  # no torch dtype: stored as uint8 bit patterns
        with pytest.raises(ValueError, match="no torch dtype"):
            dt.to_torch()
        assert torch_storage_dtype(dt) == torch.uint8
        return
    assert dt.to_torch() == td
    assert DType.from_torch(td) is dt
    assert DType.from_torch(dt.to_torch()) is dt
    assert torch_storage_dtype(dt) == td
    assert torch.empty((), dtype=td).element_size() == size


@pytest.mark.parametrize("dt", list(DType), ids=IDS)
def test_printing(dt):
    assert repr(dt) == dt.name  # MAX 26.7: repr float32, str DType.float32 (max-behaviours.md B1.4)
    assert str(dt) == f"DType.{dt.name}"
    assert f"{dt!s}" == f"DType.{dt.name}"


def test_predicates():
    f8 = {DType.float8_e4m3fn, DType.float8_e4m3fnuz, DType.float8_e5m2, DType.float8_e5m2fnuz,
          DType.float8_e8m0fnu}
    floats = f8 | {DType.float4_e2m1fn, DType.float6_e2m3fn, DType.float6_e3m2fn,
                   DType.float16, DType.bfloat16, DType.float32, DType.float64}
    signed = {DType.int8, DType.int16, DType.int32, DType.int64}
    unsigned = {DType.uint8, DType.uint16, DType.uint32, DType.uint64}
    for dt in DType:
        assert dt.is_float() == (dt in floats), dt
        assert dt.is_float8() == (dt in f8), dt
        assert dt.is_half() == (dt in {DType.float16, DType.bfloat16}), dt
        assert dt.is_integral() == (dt in signed | unsigned), dt
        assert dt.is_signed_integral() == (dt in signed), dt
        assert dt.is_unsigned_integral() == (dt in unsigned), dt
    assert not DType.bool.is_integral() and not DType.bool.is_float()
    assert [d for d in DType if d.is_float4()] == [DType.float4_e2m1fn]


@pytest.mark.parametrize("bad", [np.complex64, np.complex128, np.str_, "U4", object, "S3", "datetime64[s]"])
def test_from_numpy_unsupported(bad):
    with pytest.raises(ValueError, match="not supported"):
        DType.from_numpy(bad)


def test_from_numpy_not_a_dtype():
    with pytest.raises(ValueError, match="not a numpy dtype"):
        DType.from_numpy("not-a-dtype")


@pytest.mark.parametrize("bad", [torch.complex64, torch.complex128, torch.quint8])
def test_from_torch_unsupported(bad):
    with pytest.raises(ValueError, match="not supported"):
        DType.from_torch(bad)


def test_numpy_torch_roundtrip_through_values():
    for dt in DType:
        t = torch.zeros(3, dtype=torch_storage_dtype(dt))
        a = np.zeros(3, dtype=dt.to_numpy())
        assert t.element_size() == a.itemsize == dt.size_in_bytes


FLOATS = [d for d in DType if d.is_float()]


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_finfo_matches_the_values_of_the_type(dt):
    """Reference: every bit pattern of the type (or torch.finfo for the wide ones)."""
    f = finfo(dt)
    assert f.dtype is dt and f.smallest_normal == f.tiny
    assert f.bits == (4 if dt is DType.float4_e2m1fn else 6 if dt.name.startswith("float6_") else 8 * dt.size_in_bytes)
    npd = dt.to_numpy()
    if npd.itemsize == 1:
        raw = np.arange(256 if f.bits == 8 else 2 ** f.bits, dtype=np.uint8)
        vals = raw.view(npd).astype(np.float64)
        finite = vals[np.isfinite(vals)]
        assert f.max == finite.max() and f.min == finite.min()
        above_one = finite[finite > 1.0]
        assert f.eps == above_one.min() - 1.0
    else:
        tf = torch.finfo(dt.to_torch())
        assert (f.eps, f.max, f.min, f.tiny) == (tf.eps, tf.max, tf.min, tf.tiny)


@pytest.mark.parametrize("dt", [DType.int32, DType.bool, DType.uint8])
def test_finfo_rejects_non_floats(dt):
    with pytest.raises(TypeError, match="not a floating-point type"):
        finfo(dt)
    with pytest.raises(TypeError):
        finfo(np.float32)


MICRO = [DType.float4_e2m1fn, DType.float6_e2m3fn, DType.float6_e3m2fn, DType.float8_e8m0fnu]


@pytest.mark.parametrize("dt", MICRO, ids=lambda d: d.name)
def test_microscaling_types_store_cast_and_round_trip(dt):
    """Buffers hold the new types; graph casts to/from them match ml_dtypes' rounding."""
    from max.driver import Buffer
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, ops

    vals = np.array([0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.3, 5.2], np.float32)
    if dt is DType.float8_e8m0fnu:
        vals = np.abs(vals) + 0.125
    want = vals.astype(dt.to_numpy())
    buf = Buffer.from_numpy(want)
    assert buf.dtype is dt and buf.shape == want.shape
    np.testing.assert_array_equal(buf.to_numpy().astype(np.float32), want.astype(np.float32))
    assert Buffer.zeros([3], dt).dtype is dt
    cpu = DeviceRef.CPU()
    g = Graph("c", lambda x: (ops.cast(x, dt), ops.cast(ops.cast(x, dt), DType.float32)),
              input_types=[TensorType(DType.float32, [len(vals)], cpu)])
    narrow, back = InferenceSession().load(g).execute(Buffer.from_numpy(vals))
    assert narrow.dtype is dt
    np.testing.assert_array_equal(narrow.to_numpy().astype(np.float32), want.astype(np.float32))
    np.testing.assert_array_equal(back.to_numpy(), want.astype(np.float32))
    # a model input of that type takes a Buffer of that type
    g2 = Graph("in", lambda x: ops.cast(x, DType.float32), input_types=[TensorType(dt, [len(vals)], cpu)])
    out = InferenceSession().load(g2).execute(buf)[0].to_numpy()
    np.testing.assert_array_equal(out, want.astype(np.float32))
