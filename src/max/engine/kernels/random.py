"""Kernels for ``max.graph.ops.random``: one torch generator per device.

Every generator starts from the global seed (0 until :func:`seed` is called);
reseeding drops the generators so the next draw on each device restarts from
the new seed.  Draws happen in float32 (float64 for float64 outputs) and are
rounded to the output dtype; uniform samples stay below ``high`` after that
rounding.
"""

from __future__ import annotations

import numbers

import torch

from max.engine.kernels import kernel

_SEED = [0]
_GENERATORS: dict[torch.device, torch.Generator] = {}


def seed(value: int) -> None:
    """Reseed every device's generator; later draws repeat for the same seed."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"seed: value must be an int, got {type(value).__name__} {value!r}")
    _SEED[0] = int(value)
    _GENERATORS.clear()


def current_seed() -> int:
    """The global seed the generators start from."""
    return _SEED[0]


def generator(device: torch.device) -> torch.Generator:
    g = _GENERATORS.get(device)
    if g is None:
        g = torch.Generator(device=device)
        g.manual_seed(_SEED[0])
        _GENERATORS[device] = g
    return g


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@kernel("random.normal", pure=False)
def normal(*, shape: tuple, dtype: torch.dtype, device: torch.device, mean: float, std: float) -> torch.Tensor:
    z = torch.randn(shape, generator=generator(device), dtype=_wide(dtype), device=device)
    return (z * std + mean).to(dtype)


@kernel("random.uniform", pure=False)
def uniform(*, shape: tuple, dtype: torch.dtype, device: torch.device, low: float, high: float) -> torch.Tensor:
    wide = _wide(dtype)
    u = torch.rand(shape, generator=generator(device), dtype=wide, device=device)
    r = (u * (high - low) + low).to(dtype)
    # Rounding to a narrow dtype can reach `high`; keep the range half-open (compared in the
    # wide type: torch lacks comparisons on float8).
    back = r.to(wide)
    over = back >= high
    if bool(over.any()):
        r = torch.where(over, torch.tensor(low, dtype=wide, device=device), back).to(dtype)
    return r


@kernel("random.set_seed", pure=False)
def set_seed(*args: torch.Tensor, seed: int | None = None) -> None:
    value = int(args[0].item()) if args else seed
    _SEED[0] = int(value)
    _GENERATORS.clear()
