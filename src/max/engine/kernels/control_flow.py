"""Kernels for ``max.graph.ops.control_flow``.

Region kernels receive the node's non-chain operands positionally (own
operands first, then the enclosing-graph values the regions use), the
per-call ``env`` of symbolic dims, and ``runners``: one compiled
:class:`~max.engine.session.RegionRunner` per region.
"""

from __future__ import annotations

import torch

from max.engine.kernels import kernel


@kernel("cond", pure=False)
def cond(pred: torch.Tensor, *args: torch.Tensor, env: dict, runners: tuple) -> tuple:
    r = runners[0] if bool(pred) else runners[1]
    return tuple(r(env, (), (pred,) + args))


@kernel("while_loop", pure=False)
def while_loop(*args: torch.Tensor, env: dict, runners: tuple) -> tuple:
    pred, body = runners
    n = body.n_out
    vals = tuple(args[:n])
    while bool(pred(env, vals, args)[0]):
        vals = tuple(body(env, vals, args))
    return vals


@kernel("call", pure=False)
def call(*args: torch.Tensor, env: dict, runners: tuple, prefix: str = "") -> tuple:
    (sub,) = runners
    return tuple(sub({}, tuple(args), ()))


@kernel("fence", pure=False)
def fence(*args: torch.Tensor) -> tuple:
    return args
