"""numpy, torch and DLPack interop; memory-mapped buffers."""

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from max.dtype.dtype import BIT_STORED
from helpers_driver import ALL_DTYPES, bits, sample_array
from max.driver import CPU, Buffer, DLPackArray, MemMapTensor, Tensor
from max.dtype import DType

NUMPY_DLPACK = [d for d in ALL_DTYPES if d is not DType.bfloat16 and not d.is_float8()]


# ----------------------------------------------------------------- from_numpy / to_numpy
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_from_numpy_shares_memory_every_dtype(dtype):
    a = sample_array(dtype, (3, 4))
    b = Buffer.from_numpy(a)
    assert b.dtype is dtype and b.shape == (3, 4) and b.is_contiguous
    out = b.to_numpy()
    assert out.dtype == dtype.to_numpy()
    assert np.shares_memory(out, a)
    np.testing.assert_array_equal(bits(out), bits(a))
    # write through the buffer, read through numpy
    one = np.ones((), dtype=dtype.to_numpy())
    b[2, 3] = Buffer.from_numpy(one)
    assert bits(a)[2, 3] == bits(one)


def test_from_numpy_noncontiguous_copies():
    a = np.arange(20, dtype=np.float32).reshape(4, 5)
    for view in (a[:, ::2], a.T, a[::-1]):
        b = Buffer.from_numpy(view)
        assert b.is_contiguous
        np.testing.assert_array_equal(b.to_numpy(), view)
        assert not np.shares_memory(b.to_numpy(), a)


def test_from_numpy_misc_inputs():
    b = Buffer.from_numpy(np.float32(2.5))
    assert b.rank == 0 and b.item() == 2.5
    be = np.arange(3, dtype=">i4")
    np.testing.assert_array_equal(Buffer.from_numpy(be).to_numpy(), [0, 1, 2])
    assert Buffer.from_numpy(np.zeros((0, 3), np.int8)).shape == (0, 3)
    with pytest.raises(TypeError, match="list"):
        Buffer.from_numpy([1, 2])


@pytest.mark.parametrize("bad", [np.complex64, np.complex128, "U3", object, "S2"])
def test_from_numpy_unsupported_dtype(bad):
    with pytest.raises(ValueError, match="not supported"):
        Buffer.from_numpy(np.zeros(2, dtype=bad))


def test_read_only_arrays_are_copied():
    """MAX 26.7 copies read-only sources (max-behaviours.md B17.2): the buffer is writable, the source unchanged."""
    a = np.arange(4, dtype=np.int64)
    a.flags.writeable = False
    for b in (Buffer.from_numpy(a), Buffer.from_dlpack(a)):
        out = b.to_numpy()
        assert not np.shares_memory(out, a) and out.flags.writeable
        np.testing.assert_array_equal(out, a)
        b[0] = 9
        assert b[0].item() == 9 and a[0] == 0
    with pytest.raises(BufferError, match="read-only"):
        Buffer.from_dlpack(a, copy=False)


def test_bfloat16_and_float8_host_arrays():
    a = np.array([1.5, -2.0, 3.25], dtype=ml_dtypes.bfloat16)
    b = Buffer.from_numpy(a)
    assert b.dtype is DType.bfloat16
    assert b._torch().tolist() == [1.5, -2.0, 3.25]
    out = b.to_numpy()
    assert out.dtype == np.dtype(ml_dtypes.bfloat16) and np.shares_memory(out, a)
    f8 = np.array([0.5, 448.0], dtype=ml_dtypes.float8_e4m3fn)
    assert Buffer.from_numpy(f8)._torch().tolist() == [0.5, 448.0]
    # from_dlpack falls back to the numpy path for dtypes DLPack/numpy cannot exchange
    d = Buffer.from_dlpack(a)
    assert d.dtype is DType.bfloat16 and np.shares_memory(d.to_numpy(), a)


# ----------------------------------------------------------------- DLPack
@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(NUMPY_DLPACK),
    shape=st.lists(st.integers(1, 4), max_size=3).map(tuple),
)
def test_dlpack_numpy_roundtrip_shares(dtype, shape):
    a = sample_array(dtype, shape)
    b = Buffer.from_dlpack(a)
    assert b.dtype is dtype and b.shape == shape
    back = np.from_dlpack(b)
    assert np.shares_memory(back, a)
    np.testing.assert_array_equal(bits(back), bits(a))
    flat = a.reshape(-1)
    flat[0] = flat[-1]
    assert bits(b.to_numpy()).reshape(-1)[0] == bits(flat)[-1]


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from([d for d in ALL_DTYPES if d not in BIT_STORED]),
       shape=st.lists(st.integers(1, 4), max_size=3).map(tuple))
def test_dlpack_torch_roundtrip_shares(dtype, shape):
    t = torch.zeros(shape, dtype=dtype.to_torch())
    b = Buffer.from_dlpack(t)
    assert b.dtype is dtype and b.shape == shape
    t2 = torch.from_dlpack(b)
    assert t2.data_ptr() == t.data_ptr()
    one = torch.ones((), dtype=dtype.to_torch())
    t.view(-1)[0] = one
    assert bits(b.to_numpy()).reshape(-1)[0] == bits(Buffer._from_torch(one).to_numpy())
    b2 = Buffer.from_dlpack(t2)
    assert torch.from_dlpack(b2).data_ptr() == t.data_ptr()


def test_dlpack_protocol_and_strided_exports():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = Buffer.from_numpy(a)
    assert isinstance(b, DLPackArray)
    assert b.__dlpack_device__() == (1, 0)
    # strided view: still zero-copy through DLPack
    t = torch.from_dlpack(b[:, 1::2])
    t[0, 0] = 100
    assert a[0, 1] == 100
    # negative steps: exported as a reversed copy
    r = torch.from_dlpack(b[::-1])
    assert r.tolist() == a[::-1].tolist()
    with pytest.raises(BufferError, match="negative steps"):
        b[::-1].__dlpack__(copy=False)


def test_from_dlpack_strided_and_negative_numpy():
    # MAX refuses non-contiguous DLPack imports; copy=True (or from_numpy) copies them
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    for view in (a[:, ::2], a[::-1, ::-1]):
        with pytest.raises(ValueError, match=r"^driver buffer's from_dlpack only accepts contiguous arrays\. First "
                           r"call np\.ascontiguousarray\(array\)"):
            Buffer.from_dlpack(view)
        c = Buffer.from_dlpack(view, copy=True)
        assert c.is_contiguous
        np.testing.assert_array_equal(c.to_numpy(), view)
    # a buffer's own strided views (slicing) are still views that write through
    v = Buffer.from_numpy(a)[:, ::2]
    v[0, 1] = -1
    assert a[0, 2] == -1


def test_from_dlpack_copy_flag_and_errors():
    a = np.arange(4, dtype=np.float64)
    c = Buffer.from_dlpack(a, copy=True)
    c[0] = 7
    assert a[0] == 0
    t = torch.arange(3)
    tc = Buffer.from_dlpack(t, copy=True)
    tc[0] = 5
    assert t[0] == 0
    same = Buffer.from_dlpack(Buffer.from_numpy(a))
    same[1] = 3
    assert a[1] == 3
    with pytest.raises(TypeError, match="__dlpack__.*got int"):
        Buffer.from_dlpack(3)
    with pytest.raises(ValueError, match="complex"):
        Buffer.from_dlpack(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="not supported"):
        Buffer.from_dlpack(np.zeros(2, np.complex64))


class _Producer:
    """A foreign DLPack producer (only the protocol, no numpy/torch type)."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, **kw):
        return self._t.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def test_from_dlpack_generic_producer():
    t = torch.arange(6, dtype=torch.int16)
    b = Buffer.from_dlpack(_Producer(t))
    b[0] = 42
    assert t[0] == 42 and b.dtype is DType.int16


def test_array_protocol():
    b = Buffer.from_numpy(np.arange(3, dtype=np.int8))
    np.testing.assert_array_equal(np.asarray(b, dtype=np.float32), [0.0, 1.0, 2.0])
    assert np.array(b, copy=True).flags.owndata


# ----------------------------------------------------------------- mmap
def _file(tmp_path, arr):
    p = tmp_path / "data.bin"
    arr.tofile(p)
    return p


def test_mmap_modes(tmp_path):
    a = np.arange(12, dtype=np.float32)
    p = _file(tmp_path, a)
    cow = Buffer.mmap(p, DType.float32, (3, 4))  # default mode: copyonwrite
    assert cow.shape == (3, 4) and cow.dtype is DType.float32
    np.testing.assert_array_equal(cow.to_numpy(), a.reshape(3, 4))
    cow[0, 0] = 100
    assert cow[0, 0].item() == 100
    assert np.fromfile(p, np.float32)[0] == 0  # the file is untouched
    rw = Buffer.mmap(p, DType.float32, 12, mode="r+")
    rw[1] = -5
    del rw
    assert np.fromfile(p, np.float32)[1] == -5
    ro = Buffer.mmap(p, DType.float32, (2,), mode="r", offset=8)
    np.testing.assert_array_equal(ro.to_numpy(), [2.0, 3.0])
    ro[0] = 1.0  # MAX 26.7: a private copy-on-write mapping (max-behaviours.md B17.1)
    assert ro[0].item() == 1.0 and np.fromfile(p, np.float32)[2] == 2.0
    # zero-copy into torch
    t = torch.from_dlpack(Buffer.mmap(p, DType.float32, (12,), mode="r+"))
    t[2] = 42
    del t
    assert np.fromfile(p, np.float32)[2] == 42


def test_mmap_bfloat16(tmp_path):
    a = np.array([1.0, 2.5, -3.0, 0.5], dtype=ml_dtypes.bfloat16)
    p = _file(tmp_path, a)
    b = Buffer.mmap(p, DType.bfloat16, (2, 2), mode="r")
    assert b._torch().tolist() == [[1.0, 2.5], [-3.0, 0.5]]


def test_mmap_errors(tmp_path):
    p = _file(tmp_path, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="mode"):
        Buffer.mmap(p, DType.float32, (4,), mode="bogus")
    with pytest.raises(TypeError, match="DType"):
        Buffer.mmap(p, np.float32, (4,))
    with pytest.raises(ValueError, match="non-negative"):
        Buffer.mmap(p, DType.float32, (-1,))
    with pytest.raises(ValueError, match="offset"):
        Buffer.mmap(p, DType.float32, (1,), offset=-4)
    with pytest.raises(FileNotFoundError):
        Buffer.mmap(tmp_path / "missing.bin", DType.float32, (4,), mode="r")


def test_memmap_tensor(tmp_path):
    a = np.arange(6, dtype=np.int32)
    p = _file(tmp_path, a)
    m = MemMapTensor(p, DType.int32, (2, 3))  # default mode r+
    assert isinstance(m, Buffer) and isinstance(m, Tensor)
    assert not m.read_only
    m[1, 2] = 77
    del m
    assert np.fromfile(p, np.int32)[5] == 77
    r = MemMapTensor(p, DType.int32, (2, 3), mode="r")
    assert r.read_only
    assert type(r[0]) is Buffer
    np.testing.assert_array_equal(r[0].to_numpy(), [0, 1, 2])
    with pytest.raises(ValueError, match="read-only"):
        r[0, 0] = 1
    w = MemMapTensor(tmp_path / "new.bin", DType.float64, [4], mode="w+")
    for i in range(4):
        w[i] = 1.5
    del w
    np.testing.assert_array_equal(np.fromfile(tmp_path / "new.bin", np.float64), [1.5] * 4)
    assert "max.driver.MemMapTensor(DType.float64, (4,), cpu[0])" == repr(MemMapTensor(tmp_path / "new.bin", DType.float64, [4]))
