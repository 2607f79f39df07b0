"""Kernels for ``max.graph.ops.distributed``: collectives as torch device copies.

The result is computed once, on the first input's device, and copied to
each other device; a device that appears twice gets its own copy (results
never alias each other).
"""

from __future__ import annotations

import torch

from max.engine.kernels import kernel


def _broadcast(r: torch.Tensor, devices: tuple) -> tuple:
    outs, seen = [], set()
    for d in devices:
        if d == r.device and d not in seen:
            outs.append(r)
        else:
            outs.append(r.to(d, copy=True))
        seen.add(d)
    return tuple(outs)


@kernel("allgather", foldable=False)
def allgather(*xs: torch.Tensor, axis: int, devices: tuple) -> tuple:
    home = xs[0].device
    r = torch.cat([x.to(home) for x in xs], axis)
    return _broadcast(r, devices)


@kernel("allreduce_sum", foldable=False)
def allreduce_sum(*xs: torch.Tensor, devices: tuple) -> tuple:
    home = xs[0].device
    r = xs[0].clone() if len(xs) == 1 else xs[0] + xs[1].to(home)
    for x in xs[2:]:
        r.add_(x.to(home))
    return _broadcast(r, devices)
