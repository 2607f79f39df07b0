"""Random ops: ``gaussian`` (alias ``normal``), ``uniform`` and ``set_seed``.

``gaussian(like, mean=0.0, std=1.0)`` and ``uniform(like, range=(0, 1))``
stage a node that draws fresh samples of ``like``'s dtype, shape and device
each time the model runs (``random.normal`` / ``random.uniform`` nodes,
kernels in ``max.engine.kernels.random``).  Tensor ``mean``/``std`` broadcast
against the samples.  Samples come from one generator per device, seeded by
``set_seed`` (inside a graph: a node that reseeds when the model runs) or by
``max.experimental.random.seed``.
"""

from __future__ import annotations

import numbers
from typing import Any

from max.dtype import DType
from max.graph.ops._common import as_tensor, current_graph, fail, stage1
from max.graph.type import TensorType, _ChainType

__all__ = ["gaussian", "normal", "set_seed", "uniform"]


def _check_like(like: Any, op: str) -> TensorType:
    if not isinstance(like, TensorType):
        fail(op, f"like must be a TensorType, got {type(like).__name__} {like!r}", TypeError)
    return like


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def gaussian(like: TensorType, mean: Any = 0.0, std: Any = 1.0) -> Any:
    """Normal samples with ``like``'s type.  ValueError if ``std <= 0`` (a number ``std``)."""
    from max.graph.ops.elementwise import add, mul

    op = "random.gaussian"
    like = _check_like(like, op)
    if not like.dtype.is_float():
        fail(op, f"dtype must be a floating-point type, got {like.dtype}", TypeError)
    if _is_number(std) and not std > 0:
        fail(op, f"std must be > 0, got {std}")
    base = {"shape": like.shape, "dtype": like.dtype, "device": like.device}
    if _is_number(mean) and _is_number(std):
        return stage1("random.normal", [], like, {**base, "mean": float(mean), "std": float(std)})
    z = stage1("random.normal", [], like, {**base, "mean": 0.0, "std": 1.0})
    return add(mul(z, std), mean)


normal = gaussian


def uniform(like: TensorType, range: Any = (0, 1)) -> Any:  # noqa: A002 - reference name
    """Uniform samples in ``[range[0], range[1])`` with ``like``'s type.

    ValueError unless ``range`` is two numbers with ``min < max``.
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
    if like.dtype is DType.bool:
        fail(op, "dtype must be numeric, got DType.bool", TypeError)
    attrs = {"shape": like.shape, "dtype": like.dtype, "device": like.device, "low": float(lo), "high": float(hi)}
    return stage1("random.uniform", [], like, attrs)


def set_seed(seed: Any) -> None:
    """Reseed the random generators when the model runs (an int, or a rank-0 integer tensor)."""
    op = "random.set_seed"
    g = current_graph(op)
    if isinstance(seed, bool) or not isinstance(seed, (numbers.Integral,)) and not hasattr(seed, "dtype") \
            and not hasattr(seed, "__tensorvalue__"):
        fail(op, f"seed must be an int or an integer tensor, got {type(seed).__name__} {seed!r}", TypeError)
    operands = []
    attrs: dict = {}
    if isinstance(seed, numbers.Integral):
        attrs["seed"] = int(seed)
    else:
        t = as_tensor(seed, op=op, arg="seed")
        if t.rank != 0 or not t.dtype.is_integral():
            fail(op, f"seed must be a rank-0 integer tensor, got {t.type}", TypeError)
        operands.append(t)
    res = g._add_node(op, operands + [g._current_chain], [_ChainType()], attrs, side_effects=True)
    g._current_chain = res[0]
