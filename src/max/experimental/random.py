"""Random tensors: ``gaussian``/``normal`` and ``uniform`` (plus graph-level ``*_like``).

The ops are ``max.graph.ops.random`` (type rules) with kernels in
``max.engine.kernels.random``: one torch generator per device, seeded with
:func:`set_seed` (0 at import), so a program that seeds and then draws in the
same order gets the same numbers; :func:`seed` returns that global seed as a
uint64 ``[1]`` Tensor.  The ``*_like`` functions are those graph ops made
usable on eager tensors through ``functional``; inside a ``Graph`` they stage
a node that draws when the model runs (after ``ops.random.set_seed``).
"""

from __future__ import annotations

import numbers
from typing import Any, Iterable

import numpy as np

from max.dtype import DType
from max.engine.kernels import random as _kernels
from max.experimental._context import _resolve
from max.experimental.tensor import Tensor, functional
from max.graph.dtype_promotion import weak_scalar_fits
from max.graph.ops import random as _random
from max.graph.type import DeviceRef, TensorType

__all__ = ["gaussian", "gaussian_like", "normal", "normal_like", "uniform", "uniform_like", "seed", "set_seed"]


def set_seed(value: int) -> None:
    """Reseed the global generators (every device): later draws repeat for the same seed.

    ``value`` is an int that fits uint64 (MAX's ``Unsafe cast`` ValueError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"set_seed: value must be an int, got {type(value).__name__} {value!r}")
    if not weak_scalar_fits(int(value), DType.uint64):
        _random._unsafe_cast(int(value), DType.uint64, "random.set_seed", "value")
    _kernels.seed(int(value))


def seed(value: int | None = None) -> Tensor:
    """The global seed as a Tensor (uint64, shape ``[1]``, on the CPU).  ``seed(value)`` first
    sets it, as :func:`set_seed` does."""
    if value is not None:
        set_seed(value)
    return Tensor(np.array([_kernels.current_seed()], dtype=np.uint64))


# Graph ops usable inside a Graph and on eager tensors (functional), like functional.X.
gaussian_like = functional(_random.gaussian)
gaussian_like.__name__ = gaussian_like.__qualname__ = "gaussian_like"
normal_like = gaussian_like
uniform_like = functional(_random.uniform)
uniform_like.__name__ = uniform_like.__qualname__ = "uniform_like"


def _like(shape: Iterable[Any], dtype: DType | None, device: Any) -> TensorType:
    dtype, device = _resolve(dtype, device)
    if isinstance(shape, (int,)):
        shape = [shape]
    return TensorType(dtype, list(shape), DeviceRef.from_device(device))


def gaussian(shape: Iterable[Any] = (), mean: float = 0.0, std: float = 1.0, *, dtype: DType | None = None,
             device: Any = None) -> Tensor:
    """A tensor of normal samples (``shape`` defaults to a scalar).  ValueError if ``std <= 0``."""
    return gaussian_like(_like(shape, dtype, device), mean, std)


normal = gaussian


def uniform(shape: Iterable[Any] = (), range: Any = (0, 1), *, dtype: DType | None = None,  # noqa: A002
            device: Any = None) -> Tensor:
    """A tensor of uniform samples in ``[min, max)``.  ValueError for a bad ``range``."""
    return uniform_like(_like(shape, dtype, device), range)
