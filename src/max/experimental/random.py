"""Random tensors: ``gaussian``/``normal`` and ``uniform`` (plus graph-level ``*_like``).

Samples come from one torch generator per device, seeded with :func:`seed`
(the global compute graph's seed, 0, at import), so a program that seeds and
then draws in the same order gets the same numbers.  The ``*_like`` functions
are graph ops (``random.normal`` / ``random.uniform`` nodes, kernels
registered in the engine's kernel table): inside a ``Graph`` they stage a node
that draws when the model runs; the eager factories call them through
``functional`` like every other op.
"""

from __future__ import annotations

import numbers
from typing import Any, Iterable

import torch

from max.dtype import DType
from max.engine.kernels import register
from max.experimental.tensor import GRAPH, Tensor, defaults, functional
from max.graph import ops
from max.graph.ops._common import fail, stage1
from max.graph.type import DeviceRef, TensorType

__all__ = ["gaussian", "gaussian_like", "normal", "normal_like", "uniform", "uniform_like", "seed"]

_SEED = [GRAPH.seed]
_GENERATORS: dict[torch.device, torch.Generator] = {}


def seed(value: int) -> None:
    """Reseed every device's generator; later draws repeat for the same seed."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"seed: value must be an int, got {type(value).__name__} {value!r}")
    _SEED[0] = int(value)
    _GENERATORS.clear()


set_seed = seed


def _generator(device: torch.device) -> torch.Generator:
    g = _GENERATORS.get(device)
    if g is None:
        g = torch.Generator(device=device)
        g.manual_seed(_SEED[0])
        _GENERATORS[device] = g
    return g


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _normal_kernel(*, shape: tuple, dtype: torch.dtype, device: torch.device, mean: float, std: float) -> torch.Tensor:
    z = torch.randn(shape, generator=_generator(device), dtype=_wide(dtype), device=device)
    return (z * std + mean).to(dtype)


def _uniform_kernel(*, shape: tuple, dtype: torch.dtype, device: torch.device, low: float, high: float) -> torch.Tensor:
    u = torch.rand(shape, generator=_generator(device), dtype=_wide(dtype), device=device)
    r = (u * (high - low) + low).to(dtype)
    # Rounding to a narrow dtype can reach `high`; keep the range half-open.
    over = r >= high
    if bool(over.any()):
        r = torch.where(over, torch.tensor(low, dtype=dtype, device=device), r)
    return r


register("random.normal", _normal_kernel, pure=False)
register("random.uniform", _uniform_kernel, pure=False)


def _check_like(like: Any, op: str) -> TensorType:
    if not isinstance(like, TensorType):
        fail(op, f"like must be a TensorType, got {type(like).__name__} {like!r}", TypeError)
    return like


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _gaussian_like(like: TensorType, mean: Any = 0, std: Any = 1) -> Any:
    """Normal samples with ``like``'s dtype, shape and device (a graph op).

    Raises ValueError if ``std <= 0`` (for a number ``std``).  Tensor ``mean``
    / ``std`` broadcast against the samples.
    """
    op = "random.gaussian"
    like = _check_like(like, op)
    if not like.dtype.is_float():
        fail(op, f"dtype must be a floating-point type, got {like.dtype}", TypeError)
    if _is_number(std) and not std > 0:
        fail(op, f"std must be > 0, got {std}")
    if _is_number(mean) and _is_number(std):
        attrs = {"shape": like.shape, "dtype": like.dtype, "device": like.device,
                 "mean": float(mean), "std": float(std)}
        return stage1("random.normal", [], like, attrs)
    z = stage1("random.normal", [], like,
               {"shape": like.shape, "dtype": like.dtype, "device": like.device, "mean": 0.0, "std": 1.0})
    return ops.add(ops.mul(z, std), mean)


def _uniform_like(like: TensorType, range: Any = (0, 1)) -> Any:  # noqa: A002 - reference name
    """Uniform samples in ``[range[0], range[1])`` with ``like``'s type (a graph op).

    Raises ValueError unless ``range`` is two numbers with ``min < max``.
    """
    op = "random.uniform"
    like = _check_like(like, op)
    try:
        vals = tuple(range)
    except TypeError:
        fail(op, f"range must be a (min, max) pair, got {range!r}")
    if len(vals) != 2:
        fail(op, f"range must have exactly 2 values (min, max), got {len(vals)}: {range!r}")
    lo, hi = vals
    if not (_is_number(lo) and _is_number(hi)):
        fail(op, f"range values must be numbers, got {range!r}", TypeError)
    if not lo < hi:
        fail(op, f"range min must be < max, got min={lo} max={hi}")
    attrs = {"shape": like.shape, "dtype": like.dtype, "device": like.device, "low": float(lo), "high": float(hi)}
    return stage1("random.uniform", [], like, attrs)


# Graph ops usable inside a Graph and on eager tensors (functional), like functional.X.
gaussian_like = functional(_gaussian_like)
gaussian_like.__name__ = gaussian_like.__qualname__ = "gaussian_like"
normal_like = gaussian_like
uniform_like = functional(_uniform_like)
uniform_like.__name__ = uniform_like.__qualname__ = "uniform_like"
_gaussian_op = gaussian_like
_uniform_op = uniform_like


def _like(shape: Iterable[Any], dtype: DType | None, device: Any) -> TensorType:
    dtype, device = defaults(dtype, device)
    if isinstance(shape, (int,)):
        shape = [shape]
    return TensorType(dtype, list(shape), DeviceRef.from_device(device))


def gaussian(shape: Iterable[Any] = (), mean: float = 0.0, std: float = 1.0, *, dtype: DType | None = None,
             device: Any = None) -> Tensor:
    """A tensor of normal samples (``shape`` defaults to a scalar).  ValueError if ``std <= 0``."""
    return _gaussian_op(_like(shape, dtype, device), mean, std)


normal = gaussian


def uniform(shape: Iterable[Any] = (), range: Any = (0, 1), *, dtype: DType | None = None,  # noqa: A002
            device: Any = None) -> Tensor:
    """A tensor of uniform samples in ``[min, max)``.  ValueError for a bad ``range``."""
    return _uniform_op(_like(shape, dtype, device), range)
