"""max.driver strictness as MAX has it: one-element __setitem__, item() on rank 0 only, rank-0
assignment, from_dlpack of non-contiguous arrays, writes to mode 'r' mmaps; max_single_alloc_size
and __version__."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import max
from max import driver
from max.driver import Buffer
from max.dtype import DType


def test_setitem_one_element_only():
    b = Buffer.from_numpy(np.zeros((2, 3), np.float32))
    b[1, 2] = 5.0
    b[-1, 0] = 4.0
    np.testing.assert_array_equal(b.to_numpy(), [[0, 0, 0], [4, 0, 5]])
    for key in (0, (0,), (slice(None), 1), (Ellipsis,), (0, slice(0, 2))):
        with pytest.raises(ValueError, match="setting items across several indices is not supported"):
            b[key] = 1.0
    b[0:1].inplace_copy_from(Buffer.from_numpy(np.ones((1, 3), np.float32)))  # the supported block copy
    np.testing.assert_array_equal(b.to_numpy()[0], [1, 1, 1])
    s = Buffer.scalar(1.0, DType.float32)
    s[...] = 3.0
    assert s.item() == 3.0
    s[()] = 4.0
    assert s.item() == 4.0


def test_item_needs_one_element():
    """Today's MAX (issue 25) reads item() of any one-element buffer; spec 004 said rank 0 only."""
    with pytest.raises(ValueError, match="^calling `item` on a tensor with 2 items but expected only 1"):
        Buffer.from_numpy(np.ones((2, 1), np.float32)).item()
    assert Buffer.from_numpy(np.ones((1, 1), np.float32)).item() == 1.0
    assert Buffer.from_numpy(np.ones((1, 1), np.float32))[0, 0].item() == 1.0


def test_from_dlpack_rejects_non_contiguous():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.raises(ValueError, match="^driver buffer's from_dlpack only accepts contiguous arrays"):
        Buffer.from_dlpack(a[:, ::2])
    with pytest.raises(ValueError, match="^driver buffer's from_dlpack only accepts contiguous tensors"):
        Buffer.from_dlpack(torch.arange(12.0).reshape(3, 4).T)
    np.testing.assert_array_equal(Buffer.from_dlpack(a[:, ::2], copy=True).to_numpy(), a[:, ::2])
    np.testing.assert_array_equal(Buffer.from_numpy(a[:, ::2]).to_numpy(), a[:, ::2])  # from_numpy copies


def test_read_only_mmap_writes_stay_private(tmp_path):
    """MAX 26.7 (max-behaviours.md B17.1): writes to a mode 'r' mapping land in a private copy;
    the legacy MemMapTensor keeps mode 'r' read-only."""
    from max.driver import MemMapTensor

    f = tmp_path / "data.bin"
    np.arange(6, dtype=np.float32).tofile(f)
    b = Buffer.mmap(f, DType.float32, (2, 3), mode="r")
    b[0, 0] = 1.0
    b[1:].inplace_copy_from(Buffer.from_numpy(np.zeros((1, 3), np.float32)))
    np.testing.assert_array_equal(b.to_numpy(), [[1, 1, 2], [0, 0, 0]])
    np.testing.assert_array_equal(np.fromfile(f, dtype=np.float32), np.arange(6))
    m = MemMapTensor(f, DType.float32, (2, 3), mode="r")
    with pytest.raises(ValueError, match="read-only"):
        m[0, 0] = 1.0
    np.testing.assert_array_equal(np.fromfile(f, dtype=np.float32), np.arange(6))


def test_max_single_alloc_size_and_version():
    import os

    cpu = driver.CPU()
    assert cpu.max_single_alloc_size == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert driver.__version__ == max.__version__
