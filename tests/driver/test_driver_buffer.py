"""Buffer construction, properties, copies, views and the documented errors."""

import pickle

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers_driver import ALL_DTYPES, bits, sample_array
from max.driver import CPU, Buffer, Device, DeviceStream, Tensor
from max.dtype import DType


# ----------------------------------------------------------------- construction
def test_tensor_is_buffer():
    assert Tensor is Buffer


@pytest.mark.parametrize(
    "make",
    [
        lambda: Buffer(dtype=DType.float32, shape=[2, 3]),
        lambda: Buffer(shape=[2, 3], dtype=DType.float32, device=CPU()),
        lambda: Buffer(DType.float32, [2, 3]),
        lambda: Buffer(DType.float32, (2, 3), CPU()),
        lambda: Buffer(DType.float32, (2, 3), CPU().default_stream),
        lambda: Buffer(DType.float32, (2, 3), device=None, pinned=False),
        lambda: Buffer([2, 3], DType.float32),
        lambda: Buffer((2, 3), DType.float32, CPU()),
        lambda: Buffer(np.array([2, 3]), DType.float32),
        lambda: Buffer(DType.float32, [np.int64(2), np.int32(3)]),
        lambda: Buffer(dtype=DType.float32, shape=[2, 3], stream=DeviceStream(CPU())),
    ],
)
def test_constructor_overloads(make):
    b = make()
    assert b.shape == (2, 3) and b.dtype is DType.float32
    assert b.device is CPU() and b.is_host
    assert b.rank == 2 and b.num_elements == 6 and b.element_size == 4
    assert b.is_contiguous and not b.pinned
    assert all(type(d) is int for d in b.shape)


def test_constructor_stream_is_kept():
    s = DeviceStream(CPU())
    b = Buffer(DType.int8, [4], s)
    assert b.stream is s
    assert Buffer(DType.int8, [4]).stream is CPU().default_stream


def test_constructor_from_ndarray_copies():
    a = np.arange(6, dtype=np.int16).reshape(2, 3)
    a.flags.writeable = False
    b = Buffer(a, CPU())
    assert b.dtype is DType.int16 and b.shape == (2, 3)
    np.testing.assert_array_equal(b.to_numpy(), a)
    b[0, 0] = 9
    assert a[0, 0] == 0


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_allocates(dtype):
    b = Buffer(dtype, [3, 2])
    assert b.dtype is dtype and b.element_size == dtype.size_in_bytes
    z = Buffer.zeros([3, 2], dtype)
    assert z.dtype is dtype
    assert not bits(z.to_numpy()).any()
    assert z.to_numpy().dtype == dtype.to_numpy()


def test_rank0_and_empty():
    s = Buffer(DType.float64, [])
    assert s.shape == () and s.rank == 0 and s.num_elements == 1
    e = Buffer(DType.float32, [0, 4])
    assert e.num_elements == 0 and e.to_numpy().shape == (0, 4)
    assert Buffer(DType.int8, 5).shape == (5,)


def test_pinned_on_cpu_only_host_is_ignored():
    b = Buffer(DType.float32, [4], pinned=True)
    assert b.is_host
    assert b.pinned == torch.cuda.is_available()


# ----------------------------------------------------------------- construction errors
def test_wrong_dtype():
    with pytest.raises(TypeError, match=r"dtype must be a max.dtype.DType, got dtype\('float32'\).*DType.from_numpy"):
        Buffer(dtype=np.dtype("float32"), shape=[2])
    with pytest.raises(TypeError, match=r"torch.float32.*DType.from_torch"):
        Buffer(dtype=torch.float32, shape=[2])
    with pytest.raises(TypeError, match="'float32'"):
        Buffer([2], "float32")


def test_negative_shape():
    with pytest.raises(ValueError, match=r"non-negative, got -1 at position 1 of shape \[2, -1\]"):
        Buffer(DType.float32, [2, -1])
    with pytest.raises(ValueError, match="-3"):
        Buffer.zeros((-3,), DType.int8)


@pytest.mark.parametrize("bad", [[2.0, 3], [2, "3"], [True, 2], [None], [np.float64(2)]])
def test_non_integer_shape(bad):
    with pytest.raises(TypeError, match="shape entries must be ints"):
        Buffer(DType.float32, bad)


def test_shape_not_a_sequence():
    with pytest.raises(TypeError, match="sequence of non-negative ints"):
        Buffer(DType.float32, "23")
    with pytest.raises(TypeError, match="sequence of non-negative ints"):
        Buffer(DType.float32, 2.5)


def test_constructor_argument_errors():
    with pytest.raises(TypeError, match="missing required argument 'shape'"):
        Buffer(dtype=DType.float32)
    with pytest.raises(TypeError, match="missing required argument 'dtype'"):
        Buffer(shape=[1])
    with pytest.raises(TypeError, match="multiple values for argument 'shape'"):
        Buffer(DType.float32, [1], shape=[2])
    with pytest.raises(TypeError, match="unexpected keyword argument 'size'"):
        Buffer(DType.float32, size=[2])
    with pytest.raises(TypeError, match="device must be a max.driver.Device, got str"):
        Buffer(DType.float32, [2], "cpu")
    with pytest.raises(TypeError, match="pinned must be a bool"):
        Buffer(DType.float32, [2], None, "yes")


# ----------------------------------------------------------------- scalar / zeros / item
@pytest.mark.parametrize(
    "value,dtype,expect",
    [
        (3, DType.int32, 3),
        (2.5, DType.float32, 2.5),
        (True, DType.bool, True),
        (2**64 - 1, DType.uint64, 2**64 - 1),
        (1.5, DType.bfloat16, 1.5),
        (np.float16(0.5), DType.float16, 0.5),
        (2.0, DType.float8_e4m3fn, 2.0),
    ],
)
def test_scalar_item(value, dtype, expect):
    s = Buffer.scalar(value, dtype)
    assert s.rank == 0 and s.dtype is dtype and s.device is CPU()
    got = s.item()
    assert got == expect and type(got) is type(expect)


def test_scalar_errors():
    with pytest.raises(ValueError, match="300 does not fit in DType.uint8"):
        Buffer.scalar(300, DType.uint8)
    with pytest.raises(TypeError, match="str"):
        Buffer.scalar("1", DType.int32)
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        Buffer.scalar(np.zeros(2), DType.float32)
    with pytest.raises(ValueError, match="inf"):
        Buffer.scalar(float("inf"), DType.int32)


def test_zeros_overloads():
    for z in (
        Buffer.zeros((1, 2, 3), DType.int64),
        Buffer.zeros(DType.int64, (1, 2, 3)),
        Buffer.zeros(shape=[1, 2, 3], dtype=DType.int64, device=CPU()),
        Tensor.zeros((1, 2, 3), DType.int64, CPU()),
    ):
        assert z.shape == (1, 2, 3) and z.dtype is DType.int64
        assert (z.to_numpy() == 0).all()


def test_item_requires_one_element():
    """Today's MAX (issue 25): any one-element buffer; spec 004 allowed rank 0 only."""
    with pytest.raises(ValueError, match=r"^calling `item` on a tensor with 6 items but expected only 1 .*shape \(2, 3\)"):
        Buffer.zeros([2, 3], DType.float32).item()
    assert Buffer.zeros([1], DType.float32).item() == 0.0
    assert Buffer.zeros([2, 3], DType.float32)[1, 2].item() == 0.0


# ----------------------------------------------------------------- copies and moves
def test_copy_and_contiguous_are_deep():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = Buffer.from_numpy(a)
    for c in (b.copy(), b.copy(CPU()), b.copy(None), b.copy(CPU().default_stream), b.contiguous()):
        assert c.is_contiguous and c.device is CPU()
        np.testing.assert_array_equal(c.to_numpy(), a)
        c[0, 0] = -1
        assert a[0, 0] == 0
    s = DeviceStream(CPU())
    assert b.copy(s).stream is s
    assert b.copy(stream=s).stream is s
    v = b[::-1, 1::2]
    c = v.contiguous()
    assert not v.is_contiguous and c.is_contiguous
    np.testing.assert_array_equal(c.to_numpy(), a[::-1, 1::2])
    with pytest.raises(TypeError, match="str"):
        b.copy("cpu")


def test_to_same_device_is_no_copy():
    b = Buffer.zeros([4], DType.float32)
    assert b.to(CPU()) is b
    s = DeviceStream(CPU())
    r = b.to(s)
    assert r is not b and r.stream is s
    r[0] = 5
    assert b[0].item() == 5  # a new reference to the same memory
    lst = b.to([CPU(), CPU()])
    assert lst == [b, b]
    lst = b.to([s, CPU().default_stream])
    assert [x.stream for x in lst] == [s, CPU().default_stream]
    with pytest.raises(TypeError, match="Device"):
        b.to("gpu")


def test_inplace_copy_from():
    dst = Buffer.zeros([2, 3], DType.float32)
    src = Buffer.from_numpy(np.arange(6, dtype=np.float32))
    dst.inplace_copy_from(src)  # same element count, different shape
    np.testing.assert_array_equal(dst.to_numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    # different dtype, same byte count: raw bytes
    raw = Buffer.zeros([24], DType.uint8)
    raw.inplace_copy_from(src)
    np.testing.assert_array_equal(raw.to_numpy(), np.arange(6, dtype=np.float32).view(np.uint8))


def test_inplace_copy_from_errors():
    dst = Buffer.zeros([2, 3], DType.float32)
    with pytest.raises(ValueError, match=r"sizes differ.*\(5,\) DType.float32 \(20 bytes\).*\(2, 3\) DType.float32 \(24 bytes\)"):
        dst.inplace_copy_from(Buffer.zeros([5], DType.float32))
    # MAX 26.7's texts (max-behaviours.md B17.9): a non-contiguous source says "to", a destination "from"
    with pytest.raises(ValueError, match="^Cannot copy to non-contiguous buffer .*source"):
        dst.inplace_copy_from(Buffer.zeros([3, 4], DType.float32)[:, ::2])
    with pytest.raises(ValueError, match="^Cannot copy to non-contiguous buffer .*source"):
        dst.inplace_copy_from(Buffer.zeros([6], DType.float32)[::-1])
    with pytest.raises(ValueError, match="^Cannot copy from non-contiguous buffer .*destination"):
        Buffer.zeros([3, 4], DType.float32)[:, ::2].inplace_copy_from(Buffer.zeros([6], DType.float32))
    with pytest.raises(TypeError, match="ndarray"):
        dst.inplace_copy_from(np.zeros(6, np.float32))


# ----------------------------------------------------------------- view
def test_view_reinterprets_and_shares():
    a = np.arange(4, dtype=np.float32)
    b = Buffer.from_numpy(a)
    u = b.view(DType.uint32)
    np.testing.assert_array_equal(u.to_numpy(), a.view(np.uint32))
    u8 = b.view(DType.uint8)
    assert u8.shape == (16,)
    assert b.view(DType.float64).shape == (2,)
    assert b.view(DType.int16, [2, 4]).shape == (2, 4)
    u[0] = 0x3F800000  # bits of 1.0f
    assert a[0] == 1.0
    bf = Buffer.from_numpy(np.ones((2, 4), dtype=ml_dtypes.bfloat16))
    assert bf.view(DType.uint16).to_numpy()[0, 0] == 0x3F80


def test_view_errors():
    b = Buffer.zeros([3], DType.float32)  # 12 bytes
    with pytest.raises(ValueError, match=r"cannot deduce a shape.*12 bytes, not a multiple of 8"):
        b.view(DType.float64)
    with pytest.raises(ValueError, match=r"needs 16 bytes but the buffer holds 12 bytes"):
        b.view(DType.int32, [4])
    with pytest.raises(ValueError, match="cannot deduce"):
        Buffer.zeros([], DType.float32).view(DType.uint8)
    with pytest.raises(ValueError, match="not contiguous"):
        Buffer.zeros([4, 4], DType.float32)[:, ::2].view(DType.uint8)
    with pytest.raises(TypeError, match="DType"):
        b.view(np.int32)
    with pytest.raises(ValueError, match="non-negative"):
        b.view(DType.float32, [-3])
    # same-size views of non-contiguous buffers keep their layout
    nc = Buffer.from_numpy(np.arange(8, dtype=np.int32))[::-2]
    np.testing.assert_array_equal(nc.view(DType.uint32).to_numpy(), np.arange(8, dtype=np.uint32)[::-2])


@settings(max_examples=40, deadline=None)
@given(
    src=st.sampled_from(ALL_DTYPES),
    dst=st.sampled_from(ALL_DTYPES),
    lead=st.integers(0, 3),
    last=st.integers(0, 8),
)
def test_view_matches_numpy(src, dst, lead, last):
    a = sample_array(src, (lead, last))
    b = Buffer.from_numpy(a)
    old, new = src.size_in_bytes, dst.size_in_bytes
    if (last * old) % new:
        with pytest.raises(ValueError):
            b.view(dst)
        return
    got = b.view(dst).to_numpy()
    want = a.view(dst.to_numpy())
    assert got.shape == want.shape
    np.testing.assert_array_equal(bits(got), bits(want))


# ----------------------------------------------------------------- misc dunders
def test_len_iter_repr_array_pickle():
    b = Buffer.from_numpy(np.arange(6, dtype=np.int32).reshape(3, 2))
    assert len(b) == 3
    assert [r.to_numpy().tolist() for r in b] == [[0, 1], [2, 3], [4, 5]]
    assert repr(b) == "max.driver.Buffer(DType.int32, (3, 2), cpu[0])"  # MAX 26.7's form (max-behaviours.md B1.8)
    assert str(b) == "Buffer([[0 1]\n [2 3]\n [4 5]], dtype=DType.int32, shape=(3, 2), device=Device(type=cpu,id=0))"
    np.testing.assert_array_equal(np.asarray(b), np.arange(6).reshape(3, 2))
    with pytest.raises(TypeError, match="rank-0"):
        len(Buffer.zeros([], DType.int8))
    with pytest.raises(TypeError, match="rank-0"):
        iter(Buffer.zeros([], DType.int8)).__next__()
    p = pickle.loads(pickle.dumps(b[::-1]))
    np.testing.assert_array_equal(p.to_numpy(), np.arange(6).reshape(3, 2)[::-1])
    assert b.__eq__(b) is NotImplemented or (b == b) is True  # not overloaded


def test_from_torch_and_torch_are_zero_copy():
    t = torch.arange(6, dtype=torch.float32)
    b = Buffer._from_torch(t)
    assert type(b) is Buffer and b.dtype is DType.float32
    assert b._torch() is t and b._t is t and b._dtype is DType.float32
    assert b.device is CPU()
    with pytest.raises(ValueError, match="complex"):
        Buffer._from_torch(torch.zeros(2, dtype=torch.complex64))
    assert not hasattr(b, "__dict__")


def test_negative_step_torch_is_flipped_copy():
    a = np.arange(5, dtype=np.int64)
    v = Buffer.from_numpy(a)[::-1]
    assert v._torch().tolist() == [4, 3, 2, 1, 0]
    assert isinstance(Device(v.device), Device)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_negative_step_views_materialise_for_every_dtype(dtype):
    a = sample_array(dtype, (3, 4))
    v = Buffer.from_numpy(a)[::-1, ::-3]
    want = a[::-1, ::-3]
    np.testing.assert_array_equal(bits(Buffer._from_torch(v._torch()).to_numpy()), bits(want))
    np.testing.assert_array_equal(bits(v.contiguous().to_numpy()), bits(want))
    np.testing.assert_array_equal(bits(v.copy().to_numpy()), bits(want))
    src = np.ascontiguousarray(a[:, :2])
    for i, j in np.ndindex(*v.shape):  # writes through the reversed view, element by element
        v[i, j] = Buffer.from_numpy(np.ascontiguousarray(src[i, j]))
    ref = sample_array(dtype, (3, 4))
    ref[::-1, ::-3] = ref[:, :2].copy()
    np.testing.assert_array_equal(bits(a), bits(ref))
