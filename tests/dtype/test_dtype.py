"""The DType enum: values, sizes, predicates and numpy/torch conversions."""

import ml_dtypes
import numpy as np
import pytest
import torch

from max.dtype import DType

# (member, enum value, bytes, numpy dtype, torch dtype)
TABLE = [
    (DType.bool, 1, 1, np.bool_, torch.bool),
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
    assert len(DType) == 17


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
    assert dt.to_torch() == td
    assert DType.from_torch(td) is dt
    assert DType.from_torch(dt.to_torch()) is dt
    assert np.dtype(npd).itemsize == size
    assert torch.empty((), dtype=td).element_size() == size


@pytest.mark.parametrize("dt", list(DType), ids=IDS)
def test_printing(dt):
    assert repr(dt) == f"DType.{dt.name}"
    assert str(dt) == f"DType.{dt.name}"
    assert f"{dt!s}" == f"DType.{dt.name}"


def test_predicates():
    floats = {DType.float8_e4m3fn, DType.float8_e4m3fnuz, DType.float8_e5m2, DType.float8_e5m2fnuz,
              DType.float16, DType.bfloat16, DType.float32, DType.float64}
    f8 = {DType.float8_e4m3fn, DType.float8_e4m3fnuz, DType.float8_e5m2, DType.float8_e5m2fnuz}
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
        t = torch.zeros(3, dtype=dt.to_torch())
        a = np.zeros(3, dtype=dt.to_numpy())
        assert t.element_size() == a.itemsize == dt.size_in_bytes
