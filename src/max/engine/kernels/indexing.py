"""Kernels for ``max.graph.ops.indexing``."""

from __future__ import annotations

import math

import torch

from max.engine.kernels import kernel, register


def substitute_index(index: tuple, subs: tuple, ts: tuple, adv_ints: tuple, device: torch.device) -> tuple:
    """The torch index for a ``slice_tensor``-normalised ``index`` (shared with buffer stores).

    ``subs`` puts the tensor operands ``ts`` into it ((position, -1): the
    whole entry is an index tensor; (position, 0/1/2): slice start/stop/step
    read from a rank-0 tensor); ``adv_ints`` turns the ints at those
    positions into index tensors, since NumPy treats ints next to tensor
    indices as advanced indices and torch would apply them first.
    """
    if not (subs or adv_ints):
        return index
    idx = list(index)
    for (p, f), t in zip(subs, ts):
        if f < 0:
            idx[p] = t
        else:
            s = idx[p]
            parts = [s.start, s.stop, s.step]
            parts[f] = int(t)
            idx[p] = slice(*parts)
    if adv_ints:
        shape = torch.broadcast_shapes(*(t.shape for (p, f), t in zip(subs, ts) if f < 0))
        for p in adv_ints:
            idx[p] = torch.full(shape, idx[p], dtype=torch.int64, device=device)
    return tuple(idx)


@kernel("slice_tensor")
def slice_tensor(
    x: torch.Tensor,
    *ts: torch.Tensor,
    index: tuple,
    subs: tuple = (),
    flip: bool = False,
    adv_ints: tuple = (),
    adv_front: tuple = (),
) -> torch.Tensor:
    """``x[index]`` (see :func:`substitute_index`); ``flip`` rewrites
    negative-step slices as positive ones on flipped axes (torch has no
    negative strides); ``adv_front = (start, n)`` moves the ``n`` index dims
    torch placed at ``start`` to the front (NumPy's placement when an empty
    Ellipsis separates tensor indices)."""
    if not (subs or flip or adv_ints):
        return x[index]
    idx = substitute_index(index, subs, ts, adv_ints, x.device)
    if flip:
        idx = list(idx)
        axes = []
        ax = 0
        for p, e in enumerate(idx):
            if e is None:
                continue
            if type(e) is slice and e.step is not None and e.step < 0:
                n = x.shape[ax]
                start, stop, step = e.indices(n)
                idx[p] = slice(n - 1 - start, n - 1 - stop, -step)
                axes.append(ax)
            ax += 1
        if axes:
            x = x.flip(axes)
        idx = tuple(idx)
    if adv_front:
        start, n = adv_front
        return x[idx].movedim(tuple(range(start, start + n)), tuple(range(n)))
    return x[idx]


@kernel("gather")
def gather(x: torch.Tensor, idx: torch.Tensor, axis: int) -> torch.Tensor:
    # advanced indexing on one axis == numpy.take (negative indices wrap)
    return x[(slice(None),) * axis + (idx,)]


def _nd_index(idx: torch.Tensor) -> tuple:
    return tuple(idx[..., j] for j in range(idx.shape[-1]))


@kernel("gather_nd")
def gather_nd(x: torch.Tensor, idx: torch.Tensor, batch_dims: int = 0) -> torch.Tensor:
    if idx.shape[-1] == 0:
        # index depth 0: every (empty) index vector selects all of input past the batch dims
        lead = tuple(idx.shape[:-1])
        rest = tuple(x.shape[batch_dims:])
        xb = x.reshape(tuple(x.shape[:batch_dims]) + (1,) * (len(lead) - batch_dims) + rest)
        return xb.expand(lead + rest).clone()
    if batch_dims == 0:
        return x[_nd_index(idx)]
    bshape = x.shape[:batch_dims]
    nb = 1
    for d in bshape:
        nb *= d
    xf = x.reshape((nb,) + tuple(x.shape[batch_dims:]))
    gshape = tuple(idx.shape[batch_dims:-1])
    idf = idx.reshape((nb,) + gshape + (idx.shape[-1],))
    b = torch.arange(nb, device=x.device).reshape((nb,) + (1,) * len(gshape))
    out = xf[(b,) + _nd_index(idf)]
    return out.reshape(tuple(bshape) + gshape + tuple(x.shape[batch_dims + idx.shape[-1]:]))


@kernel("scatter")
def scatter(x: torch.Tensor, updates: torch.Tensor, idx: torch.Tensor, axis: int) -> torch.Tensor:
    idx = torch.where(idx < 0, idx + x.shape[axis], idx)
    return torch.scatter(x, axis, idx, updates)


@kernel("scatter_nd")
def scatter_nd(x: torch.Tensor, updates: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    out = x.clone()
    out[_nd_index(idx)] = updates
    return out


_REDUCE = {"add": "sum", "max": "amax", "min": "amin", "mul": "prod"}


def _scatter_reduce(kind: str):
    how = _REDUCE[kind]

    def fn(x: torch.Tensor, updates: torch.Tensor, idx: torch.Tensor, axis: int) -> torch.Tensor:
        idx = torch.where(idx < 0, idx + x.shape[axis], idx)
        return torch.scatter_reduce(x, axis, idx, updates, how, include_self=True)

    return fn


def _scatter_nd_reduce(kind: str):
    how = _REDUCE[kind]

    def fn(x: torch.Tensor, updates: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        k = idx.shape[-1]
        lead = x.shape[:k]
        rest = x.shape[k:]
        # flat row index of each update in x viewed as [prod(lead), *rest]
        idx = torch.where(idx < 0, idx + torch.tensor(lead, device=idx.device), idx).reshape(-1, k)
        strides = torch.tensor([math.prod(lead[j + 1:]) for j in range(k)], device=idx.device)
        rows = (idx * strides).sum(-1)
        flat = x.reshape((-1,) + tuple(rest))
        upd = updates.reshape((rows.shape[0],) + tuple(rest))
        index = rows.reshape((-1,) + (1,) * len(rest)).expand_as(upd)
        return torch.scatter_reduce(flat, 0, index, upd, how, include_self=True).reshape(x.shape)

    return fn


for _kind in _REDUCE:
    register(f"scatter_{_kind}", _scatter_reduce(_kind))
    register(f"scatter_nd_{_kind}", _scatter_nd_reduce(_kind))
