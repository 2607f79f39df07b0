"""MAX 26.7 behaviours of ``max.driver.Buffer`` / ``Device`` (B17) and ``max.graph.buffer_utils`` (B18)
from ``../shared/max-behaviours.md``: each test names its fact."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from max.driver import CPU, Buffer
from max.dtype import DType
from max.graph import buffer_utils


def _nc() -> tuple[np.ndarray, Buffer]:
    base = np.arange(90, dtype=np.int32).reshape(3, 10, 3)
    return base, Buffer.from_numpy(base)[:, 0, :]


# ----------------------------------------------------------------------------- B17 Buffer
@pytest.mark.parametrize("mode", ["r", "readonly", "c"])
def test_B17_1_mmap_read_mode_is_a_private_copy(tmp_path, mode):
    path = tmp_path / "data.bin"
    data = np.arange(1, 9, dtype=np.int8)
    data.tofile(path)
    t = Buffer.mmap(path, dtype=DType.int8, shape=(2, 3), offset=2, mode=mode)
    np.testing.assert_array_equal(t.to_numpy(), data[2:8].reshape(2, 3))
    t[0, 0] = 0
    assert t[0, 0].item() == 0 and t.to_numpy().flags.writeable
    np.testing.assert_array_equal(np.fromfile(path, np.int8), data)  # the file is unchanged


def test_B17_1_mmap_r_plus_writes_through(tmp_path):
    path = tmp_path / "data.bin"
    np.arange(1, 9, dtype=np.int8).tofile(path)
    t = Buffer.mmap(path, dtype=DType.int8, shape=(2, 3), offset=2, mode="r+")
    t[0, 0] = 0
    del t
    assert np.fromfile(path, np.int8)[2] == 0


def test_B17_2_read_only_sources_are_copied(tmp_path):
    path = tmp_path / "m.bin"
    np.arange(4, dtype=np.float32).tofile(path)
    mm = np.memmap(path, dtype=np.float32, mode="r")
    ro = np.arange(4, dtype=np.float32)
    ro.flags.writeable = False
    for src in (mm, ro):
        for make in (Buffer.from_dlpack, Buffer.from_numpy):
            b = make(src)
            b[0] = 5
            assert b[0].item() == 5.0
            np.testing.assert_array_equal(np.asarray(src), np.arange(4))
    np.testing.assert_array_equal(np.fromfile(path, np.float32), np.arange(4))
    # a writable source is still shared, zero-copy
    w = np.arange(4, dtype=np.float32)
    Buffer.from_dlpack(w)[1] = 7
    assert w[1] == 7


def test_B17_3_from_dlpack_of_a_buffer_is_the_same_object():
    b = Buffer.from_numpy(np.arange(6, dtype=np.float32))
    assert Buffer.from_dlpack(b) is b
    c = Buffer.from_dlpack(b, copy=True)
    assert c is not b
    c[0] = 9
    assert b[0].item() == 0.0 and c[0].item() == 9.0


def test_B17_4_from_dlpack_non_contiguous_numpy_and_torch():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    for view in (a[:, ::2], a.T, a[::-1]):
        with pytest.raises(ValueError, match=r"^driver buffer's from_dlpack only accepts contiguous arrays\. "
                           r"First call np\.ascontiguousarray\(array\)"):
            Buffer.from_dlpack(view)
    t = torch.arange(12.0).reshape(3, 4)
    for view in (t.T, t[:, ::2]):
        with pytest.raises(ValueError, match=r"^driver buffer's from_dlpack only accepts contiguous tensors\. "
                           r"First call \.contiguous\(\) on the tensor"):
            Buffer.from_dlpack(view)
    # the same rule for experimental tensors made from DLPack arrays
    from max.experimental.tensor import Tensor

    with pytest.raises(ValueError, match="only accepts contiguous"):
        Tensor.from_dlpack(a.T)
    np.testing.assert_array_equal(Buffer.from_dlpack(a.T, copy=True).to_numpy(), a.T)
    np.testing.assert_array_equal(Buffer.from_dlpack(np.ascontiguousarray(a.T)).to_numpy(), a.T)
    np.testing.assert_array_equal(Buffer.from_dlpack(t.T.contiguous()).to_numpy(), t.T.numpy())


def test_B17_5_item_needs_one_element():
    with pytest.raises(ValueError, match=r"^calling `item` on a tensor with 2 items but expected only 1"):
        Buffer.from_numpy(np.array([1, 2], np.int32)).item()
    with pytest.raises(ValueError, match=r"^calling `item` on a tensor with 0 items but expected only 1"):
        Buffer.from_numpy(np.zeros((0,), np.int32)).item()
    assert Buffer.from_numpy(np.array([[3]], np.int32)).item() == 3


def test_B17_6_rank0_setitem_with_index_0_and_getitem_error():
    s = Buffer.scalar(5, DType.int32)
    s[0] = 8
    assert s.item() == 8
    s[()] = 9
    assert s.item() == 9
    with pytest.raises(ValueError, match=r"^the provided number of indices \(1\) is not equal to the tensor "
                       r"rank \(0\)"):
        s[0]
    b = Buffer.zeros([2, 3], DType.float32)
    with pytest.raises(ValueError, match=r"^the provided number of indices \(3\) is not equal to the tensor "
                       r"rank \(2\)"):
        b[0, 0, 0]


def test_B17_7_misaligned_view():
    src = np.arange(13, dtype=np.uint8)
    b = Buffer.from_numpy(src)
    v = b[1:].view(DType.int32)
    assert v.shape == (3,) and v.dtype is DType.int32
    want = src[1:].view(np.int32)  # numpy's reading of the same bytes (little-endian)
    assert [v[i].item() for i in range(3)] == want.tolist()
    assert not v._aligned()
    c = v.copy()
    assert c._aligned() and c.to_numpy().tolist() == want.tolist()
    v[0] = -1  # the view shares the memory
    assert src[1:5].tolist() == [255, 255, 255, 255]
    assert b._aligned() and Buffer.zeros([4], DType.float64)._aligned()


def test_B17_8_inplace_copy_from_itself_is_a_no_op():
    base, nc = _nc()
    before = base.copy()
    nc.inplace_copy_from(nc)
    np.testing.assert_array_equal(base, before)
    c = Buffer.from_numpy(np.arange(4, dtype=np.float32))
    c.inplace_copy_from(c)
    np.testing.assert_array_equal(c.to_numpy(), np.arange(4))


def test_B17_9_inplace_copy_from_non_contiguous():
    _, nc = _nc()
    src = Buffer.from_numpy(np.zeros((3, 3), np.int32))
    with pytest.raises(ValueError, match="^Cannot copy from non-contiguous buffer"):
        nc.inplace_copy_from(src)  # non-contiguous destination (MAX's wording)
    dst = Buffer.from_numpy(np.zeros((3, 3), np.int32))
    with pytest.raises(ValueError, match="^Cannot copy to non-contiguous buffer"):
        dst.inplace_copy_from(nc)  # non-contiguous source


def test_B17_10_non_contiguous_views_export_the_right_values():
    """MAX 26.7 is wrong here: its ``to_numpy()``, ``copy()`` and DLPack export of a non-contiguous view
    ignore the strides and give ``[[0,1,2],[3,4,5],[6,7,8]]`` (only ``nc[i, j].item()`` is right).
    libremax keeps the correct values, those of the numpy view ``base[:, 0, :]`` (the rule 2 of
    max-behaviours.md: where MAX is observably wrong, stay right and say so)."""
    base, nc = _nc()
    right = base[:, 0, :]
    assert right.tolist() == [[0, 1, 2], [30, 31, 32], [60, 61, 62]]
    np.testing.assert_array_equal(nc.to_numpy(), right)
    np.testing.assert_array_equal(nc.copy().to_numpy(), right)
    np.testing.assert_array_equal(np.from_dlpack(nc), right)
    np.testing.assert_array_equal(torch.from_dlpack(nc).numpy(), right)
    assert [[nc[i, j].item() for j in range(3)] for i in range(3)] == right.tolist()


def test_B17_11_cpu_architecture_name():
    with pytest.raises(ValueError, match=r"^failed to get device architecture name: Not implemented for "
                       r"device: cpu"):
        CPU().architecture_name


# ----------------------------------------------------------------------------- B18 buffer_utils
def test_B18_1_cast_dlpack_to():
    params = list(inspect.signature(buffer_utils.cast_dlpack_to).parameters)
    assert params == ["raw_tensor", "old_dtype", "new_dtype", "device", "session"]
    assert inspect.signature(buffer_utils.cast_dlpack_to).parameters["session"].default is None
    out = buffer_utils.cast_dlpack_to(np.array([1.0, 2.0, 3.0], np.float32), DType.float32, DType.int32, CPU())
    assert isinstance(out, Buffer) and out.dtype is DType.int32 and out.to_numpy().tolist() == [1, 2, 3]
    # a torch tensor; and raw bits read as old_dtype (bfloat16 bits held in int16)
    t = buffer_utils.cast_dlpack_to(torch.tensor([1.5, -2.0]), DType.float32, DType.float64, CPU())
    assert t.dtype is DType.float64 and t.to_numpy().tolist() == [1.5, -2.0]
    bits = torch.tensor([1.5, -2.0], dtype=torch.bfloat16).view(torch.int16)
    bf = buffer_utils.cast_dlpack_to(bits, DType.bfloat16, DType.float32, CPU())
    assert bf.to_numpy().tolist() == [1.5, -2.0]
    with pytest.raises(ValueError, match="cannot be read as old_dtype"):
        buffer_utils.cast_dlpack_to(np.zeros(2, np.float32), DType.float64, DType.float32, CPU())


def test_B18_2_cast_tensors_to_and_cast_tensor_to():
    assert list(inspect.signature(buffer_utils.cast_tensors_to).parameters) == ["tensors", "new_dtype", "session"]
    assert list(inspect.signature(buffer_utils.cast_tensor_to).parameters) == ["tensor", "new_dtype", "session"]
    assert buffer_utils.cast_tensors_to(None, DType.int32) == []
    assert buffer_utils.cast_tensors_to([], DType.int32) == []
    a = np.array([0.5, 1.5, -2.5], np.float32)
    outs = buffer_utils.cast_tensors_to([Buffer.from_numpy(a), Buffer.from_numpy(a[:2])], DType.float64)
    assert [o.to_numpy().tolist() for o in outs] == [a.astype(np.float64).tolist(), [0.5, 1.5]]
    one = buffer_utils.cast_tensor_to(Buffer.from_numpy(a), DType.float16)
    np.testing.assert_array_equal(one.to_numpy(), a.astype(np.float16))
