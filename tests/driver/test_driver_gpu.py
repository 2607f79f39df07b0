"""Buffers on an accelerator (skipped without one)."""

import ml_dtypes
import numpy as np
import pytest
import torch

from max.driver import CPU, Accelerator, Buffer, DeviceStream
from max.dtype import DType

pytestmark = pytest.mark.gpu


def test_gpu_allocation_and_moves():
    gpu = Accelerator()
    b = Buffer(shape=[2, 3], dtype=DType.float32, device=gpu)
    assert b.device is gpu and not b.is_host and b.shape == (2, 3)
    assert b.stream is gpu.default_stream
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    h = Buffer.from_numpy(a)
    g = h.to(gpu)
    assert g.device is gpu and g.to(gpu) is g
    np.testing.assert_array_equal(g.to_numpy(), a)  # to_numpy copies from the device
    back = g.to(CPU())
    assert back.is_host
    np.testing.assert_array_equal(back.to_numpy(), a)
    c = h.copy(gpu)
    c[0, 0] = 5
    assert a[0, 0] == 0 and c[0, 0].item() == 5
    z = Buffer.zeros([4], DType.bfloat16, gpu)
    assert z.to_numpy().dtype == np.dtype(ml_dtypes.bfloat16)
    assert Buffer.scalar(3, DType.int32, gpu).item() == 3


def test_gpu_streams_and_copies():
    gpu = Accelerator()
    s = DeviceStream(gpu)
    b = Buffer(DType.float32, [8], s)
    assert b.stream is s
    h = Buffer.from_numpy(np.arange(8, dtype=np.float32))
    g = h.to(s)
    assert g.device is gpu and g.stream is s
    s.synchronize()
    assert g.to(gpu.default_stream)._torch().data_ptr() == g._torch().data_ptr()
    c = g.copy(s)
    s.synchronize()
    np.testing.assert_array_equal(c.to_numpy(), np.arange(8, dtype=np.float32))
    dst = Buffer.zeros([8], DType.float32, gpu)
    dst.inplace_copy_from(h)  # host -> device
    np.testing.assert_array_equal(dst.to_numpy(), np.arange(8, dtype=np.float32))
    h2 = Buffer.zeros([2, 4], DType.float32)
    h2.inplace_copy_from(dst)  # device -> host
    np.testing.assert_array_equal(h2.to_numpy().reshape(-1), np.arange(8, dtype=np.float32))
    lst = h.to([gpu, CPU()])
    assert lst[0].device is gpu and lst[1] is h


def test_gpu_slicing_and_dlpack():
    gpu = Accelerator()
    a = np.arange(24, dtype=np.int32).reshape(4, 6)
    g = Buffer.from_numpy(a).to(gpu)
    np.testing.assert_array_equal(g[::-1, 1::2].to_numpy(), a[::-1, 1::2])
    g[::-1, 0] = np.array([1, 2, 3, 4], dtype=np.int32)
    ref = a.copy()
    ref[::-1, 0] = [1, 2, 3, 4]
    np.testing.assert_array_equal(g.to_numpy(), ref)
    t = torch.from_dlpack(g)
    assert t.is_cuda and t.data_ptr() == g._torch().data_ptr()
    b = Buffer.from_dlpack(t)
    assert b.device is gpu
    assert g.__dlpack_device__()[0] in (2, 10)  # kDLCUDA / kDLROCM


def test_pinned_memory():
    gpu = Accelerator()
    p = Buffer(DType.float32, [16], device=gpu, pinned=True)
    assert p.pinned and p.is_host
    p.to_numpy()[:] = np.arange(16, dtype=np.float32)
    g = p.to(gpu)
    gpu.synchronize()
    np.testing.assert_array_equal(g.to_numpy(), np.arange(16, dtype=np.float32))
    assert Buffer(DType.int8, [4], pinned=True).pinned
