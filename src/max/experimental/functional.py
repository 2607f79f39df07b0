"""Graph ops that work both while building a ``Graph`` and on eager tensors.

Each function here is ``functional(max.graph.ops.X)``: the same op, defined
once in ``max.graph.ops``.  Inside a graph it stages the node (returning a
``TensorValue``); on :class:`~max.experimental.tensor.Tensor` arguments it runs
the op's type rule at the call and then its kernel (or stages it lazily), see
:mod:`max.experimental.tensor`.
"""

from __future__ import annotations

from typing import Any, Callable

from max.graph import ops as _ops
from max.experimental.tensor import functional

_NAMES = (
    "abs", "add", "argmax", "argmin", "argsort", "as_interleaved_complex", "atanh", "avg_pool2d",
    "band_part", "broadcast_to", "cast", "chunk", "constant", "constant_external", "conv2d",
    "conv2d_transpose", "conv3d", "cos", "cumsum", "custom", "div", "equal", "erf", "exp", "flatten",
    "floor", "fold", "gather", "gather_nd", "gelu", "greater", "greater_equal", "hann_window", "irfft",
    "is_inf", "is_nan", "layer_norm", "log", "log1p", "logical_and", "logical_not", "logical_or",
    "logical_xor", "logsoftmax", "masked_scatter", "matmul", "max", "max_pool2d", "mean", "min", "mod",
    "mul", "negate", "nonzero", "not_equal", "outer", "pad", "permute", "pow", "range", "relu",
    "repeat_interleave", "reshape", "round", "rsqrt", "scatter", "scatter_nd", "sigmoid", "silu", "sin",
    "slice_tensor", "softmax", "split", "sqrt", "squeeze", "stack", "sub", "sum", "tanh", "tile", "top_k",
    "transfer_to", "transpose", "trunc", "unsqueeze", "where",
    # not in the reference's functional list, but the same op and useful eagerly
    "concat",
)


def _late(name: str) -> Callable[..., Any]:
    """``ops.<name>`` looked up at call time (for ops the graph layer does not define yet)."""

    def op(*args: Any, **kwargs: Any) -> Any:
        f = getattr(_ops, name, None)
        if f is None:
            raise NotImplementedError(f"{name}: max.graph.ops.{name} is not implemented in libremax yet")
        return f(*args, **kwargs)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"See max.graph.ops.{name}."
    return op


for _name in _NAMES:
    _f = getattr(_ops, _name, None)
    globals()[_name] = functional(_f if callable(_f) else _late(_name))

__all__ = ["functional", *_NAMES]

from max.experimental import tensor as _tensor  # noqa: E402

_tensor._add, _tensor._sub, _tensor._mul, _tensor._div = add, sub, mul, div  # type: ignore[name-defined]  # noqa: F821
del _name, _f
