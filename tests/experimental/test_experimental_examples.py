"""The reference's max.experimental examples, run unchanged (each block verbatim)."""

from __future__ import annotations

import numpy as np

from max.driver import CPU
from max.dtype import DType


def test_random_module_example():
    from max.experimental import random
    from max.dtype import DType
    from max.driver import CPU

    tensor1 = random.uniform((2, 3), dtype=DType.float32, device=CPU())

    tensor2 = random.uniform((4, 4), range=(0, 1), dtype=DType.float32, device=CPU())
    # --- checks (not part of the example)
    assert tuple(tensor1.shape) == (2, 3) and tuple(tensor2.shape) == (4, 4)
    assert 0 <= np.asarray(tensor2).min() and np.asarray(tensor2).max() < 1


def test_gaussian_example():
    from max.experimental import random
    from max.driver import CPU
    from max.dtype import DType

    # Standard normal distribution
    tensor = random.gaussian((2, 3), dtype=DType.float32, device=CPU())
    # --- checks
    assert tensor.dtype == DType.float32 and np.asarray(tensor).shape == (2, 3)


def test_uniform_example():
    from max.experimental import random
    from max.dtype import DType
    from max.driver import CPU

    # Generate 2x3 tensor with values between 0 and 1
    tensor1 = random.uniform((2, 3), dtype=DType.float32, device=CPU())

    tensor2 = random.uniform((4, 4), range=(0, 1), dtype=DType.float32, device=CPU())
    # --- checks
    a = np.asarray(tensor1)
    assert a.shape == (2, 3) and (a >= 0).all() and (a < 1).all() and tensor2.real


def test_tensor_module_example():
    from max.experimental import tensor
    from max.driver import CPU
    from max.dtype import DType
    x = tensor.Tensor.ones((2, 3), dtype=DType.float32, device=CPU())
    y = tensor.Tensor.zeros((2, 3), dtype=DType.float32, device=CPU())
    result = x + y  # Eager execution with automatic compilation
    # --- checks
    np.testing.assert_array_equal(np.asarray(result), np.ones((2, 3), np.float32))
    assert "Tensor(" in repr(result)


_ = (CPU, DType)
