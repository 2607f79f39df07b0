"""Kernels for ``max.graph.ops.shape``.

Layout ops return torch views where torch does (transpose, permute, expand,
split, squeeze); copies happen only where the data must move (cat, stack,
repeat, pad, repeat_interleave, band_part).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from max.engine.kernels import kernel


@kernel("reshape")
def reshape(x: torch.Tensor, shape: tuple) -> torch.Tensor:
    return x.reshape(shape)


@kernel("shape_to_tensor")
def shape_to_tensor(shape: tuple) -> torch.Tensor:
    return torch.tensor(shape, dtype=torch.int64)


@kernel("transpose")
def transpose(x: torch.Tensor, axis_1: int, axis_2: int) -> torch.Tensor:
    return x.transpose(axis_1, axis_2)


@kernel("permute")
def permute(x: torch.Tensor, dims: tuple) -> torch.Tensor:
    return x.permute(dims)


@kernel("squeeze")
def squeeze(x: torch.Tensor, axis: int) -> torch.Tensor:
    return x.squeeze(axis)


@kernel("unsqueeze")
def unsqueeze(x: torch.Tensor, axis: int) -> torch.Tensor:
    return x.unsqueeze(axis)


@kernel("flatten")
def flatten(x: torch.Tensor, start_dim: int, end_dim: int) -> torch.Tensor:
    return torch.flatten(x, start_dim, end_dim)


def _check(what: str, got: Any, expect: tuple, message: str = "") -> None:
    """Raise when ``got`` (a shape) does not match ``expect`` (ints / None for unchecked)."""
    why = f": {message}" if message else ""
    if len(got) != len(expect):
        raise ValueError(f"{what}: got shape {list(got)}, expected rank {len(expect)}{why}")
    for i, (n, e) in enumerate(zip(got, expect)):
        if e is not None and n != e:
            raise ValueError(f"{what}: dim {i} is {n}, expected {e} (shape {list(got)}){why}")


@kernel("broadcast_to")
def broadcast_to(x: torch.Tensor, shape_t: torch.Tensor | None = None, shape: tuple | None = None,
                 expect: tuple | None = None) -> torch.Tensor:
    if shape_t is None:
        return x.expand(shape)
    sizes = [int(v) for v in shape_t.tolist()]
    _check("broadcast_to: the shape tensor", sizes, expect)  # type: ignore[arg-type]
    return x.expand(sizes)


@kernel("concat")
def concat(*xs: torch.Tensor, axis: int) -> torch.Tensor:
    return torch.cat(xs, dim=axis)


@kernel("stack")
def stack(*xs: torch.Tensor, axis: int) -> torch.Tensor:
    return torch.stack(xs, dim=axis)


@kernel("split")
def split(x: torch.Tensor, split_sizes: tuple, axis: int) -> tuple:
    return torch.split(x, list(split_sizes), dim=axis)


@kernel("chunk")
def chunk(x: torch.Tensor, chunks: int, axis: int) -> tuple:
    # the type rule guarantees an exact division, so torch.chunk's sizes are all equal
    return torch.chunk(x, chunks, dim=axis)


@kernel("tile")
def tile(x: torch.Tensor, repeats: tuple) -> torch.Tensor:
    return x.repeat(repeats)


def _pad_index(n: int, before: int, after: int, mode: str, device: torch.device) -> torch.Tensor:
    """Source positions of a padded axis: ``reflect`` mirrors without repeating the edge
    (again and again when a pad is longer than the axis, as ``np.pad`` does), ``edge`` clamps."""
    i = torch.arange(-before, n + after, device=device)
    if mode == "edge":
        return i.clamp(0, n - 1)
    if n == 1:
        return torch.zeros_like(i)
    period = 2 * (n - 1)
    i = torch.remainder(i, period)
    return torch.where(i >= n, period - i, i)


@kernel("pad")
def pad(x: torch.Tensor, value_t: torch.Tensor | None = None, *, paddings: tuple,
        value: Any = None, mode: str = "constant") -> torch.Tensor:
    # ours: (before_0, after_0, before_1, ...); torch: pairs from the last dim.
    n = len(paddings) // 2
    if mode != "constant":
        for axis in range(n):
            before, after = paddings[2 * axis], paddings[2 * axis + 1]
            if before or after:
                size = x.shape[axis]
                if size == 0:
                    raise ValueError(f"pad: mode={mode!r}: dim {axis} is empty")
                x = x.index_select(axis, _pad_index(size, before, after, mode, x.device))
        return x
    if value_t is None:
        tp = [p for i in reversed(range(n)) for p in (paddings[2 * i], paddings[2 * i + 1])]
        return F.pad(x, tp, mode="constant", value=value)
    shape = [d + paddings[2 * i] + paddings[2 * i + 1] for i, d in enumerate(x.shape)]
    out = value_t.to(x.dtype).expand(shape).clone()
    out[tuple(slice(paddings[2 * i], paddings[2 * i] + d) for i, d in enumerate(x.shape))] = x
    return out


@kernel("rebind", foldable=False)
def rebind(x: torch.Tensor, expect: tuple, message: str = "") -> torch.Tensor:
    """Identity after asserting the shape.

    ``expect`` holds, per dim: an int (required size), a str (a symbol bound
    here: equal names need equal sizes) or None (checked by the lowering).
    """
    why = f": {message}" if message else ""
    if x.dim() != len(expect):
        raise ValueError(f"rebind: got shape {list(x.shape)}, expected rank {len(expect)}{why}")
    names: dict = {}
    for i, (n, e) in enumerate(zip(x.shape, expect)):
        if e is None:
            continue
        if isinstance(e, str):
            prev = names.setdefault(e, (i, n))
            if prev[1] != n:
                raise ValueError(f"rebind: dims {prev[0]} and {i} are both {e} but have sizes {prev[1]} and {n} "
                                 f"(shape {list(x.shape)}){why}")
        elif n != e:
            raise ValueError(f"rebind: dim {i} is {n}, expected {e} (shape {list(x.shape)}){why}")
    return x


@kernel("repeat_interleave")
def repeat_interleave(x: torch.Tensor, repeats_t: torch.Tensor | None = None, *, axis: int,
                      repeats: int | None = None, expect: int | None = None) -> torch.Tensor:
    if repeats_t is None:
        return torch.repeat_interleave(x, repeats, dim=axis)
    if repeats_t.dim() == 0 or repeats_t.numel() == 1:
        out = torch.repeat_interleave(x, repeats_t.reshape(()), dim=axis)
    else:
        out = torch.repeat_interleave(x, repeats_t, dim=axis)
    if expect is not None and out.shape[axis] != expect:
        raise ValueError(f"repeat_interleave: the result has {out.shape[axis]} entries along axis {axis}, "
                         f"but out_dim is {expect}")
    return out


@kernel("band_part")
def band_part(x: torch.Tensor, num_lower: int | None, num_upper: int | None, exclude: bool) -> torch.Tensor:
    m = torch.arange(x.shape[-2], device=x.device).unsqueeze(1)
    n = torch.arange(x.shape[-1], device=x.device).unsqueeze(0)
    keep = torch.ones((x.shape[-2], x.shape[-1]), dtype=torch.bool, device=x.device)
    if num_lower is not None:
        keep &= (m - n) <= num_lower
    if num_upper is not None:
        keep &= (n - m) <= num_upper
    if exclude:
        keep = ~keep
    return torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device))
