"""Random ops: ``gaussian`` (alias ``normal``), ``uniform``, ``set_seed`` and ``SeedType``.

A graph must be seeded before it draws: ``set_seed(seed)`` (an int that fits
uint64, or a rank-0 / ``[1]`` tensor of any dtype, such as a ``SeedType``
input) stages a node that reseeds the generators when the model runs, and
``gaussian`` / ``uniform`` in a graph with no ``set_seed`` raise
``RuntimeError("No seed set! ...")``, as MAX 26.7 does.  The eager compute graph
(``max.experimental``) is always seeded: its seed is the global one of
``max.experimental.random.seed``.

``gaussian(like, mean=0.0, std=1.0)`` and ``uniform(like, range=(0, 1))`` stage
a node that draws fresh samples of ``like``'s type each time the model runs
(``random.normal`` / ``random.uniform``, kernels in
``max.engine.kernels.random``); any dtype is accepted:

* float16/bfloat16/float32/float64 draw in their own type;
* ``gaussian`` on other dtypes (integers, bool, float8, float4) draws float32
  samples and casts them (``ops.cast``: integers truncate and wrap, bool is
  ``!= 0``);
* ``uniform`` on integers draws integers in ``[min, max)``; on bool (whose
  only range is ``(0, 1)``: 2 does not fit) a fair coin; on float8 it draws
  in that type.  Number bounds must fit ``like``'s dtype
  (``Unsafe cast`` ValueError); tensor bounds broadcast against the samples.
  Sub-byte types (float4/float6) are refused as MAX refuses their constants.
"""

from __future__ import annotations

import numbers
from typing import Any

from max.dtype import DType
from max.dtype.dtype import BIT_STORED
from max.graph.dtype_promotion import weak_scalar_fits
from max.graph.ops._common import as_tensor, current_graph, fail, stage1
from max.graph.type import DeviceRef, TensorType, _ChainType

__all__ = ["SeedType", "gaussian", "normal", "set_seed", "uniform"]

# float types the kernels draw in directly
_NATIVE = (DType.float16, DType.bfloat16, DType.float32, DType.float64)


def SeedType(device: DeviceRef) -> TensorType:  # noqa: N802 - MAX's name
    """The type of a seed input: ``TensorType(uint64, [1], device)``."""
    return TensorType(DType.uint64, [1], device)


def _check_like(like: Any, op: str) -> TensorType:
    if not isinstance(like, TensorType):
        fail(op, f"like must be a TensorType, got {type(like).__name__} {like!r}", TypeError)
    return like


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _unsafe_cast(value: Any, dtype: DType, op: str, arg: str) -> None:
    """MAX's ValueError for a Python number that ``dtype`` cannot hold."""
    if isinstance(value, numbers.Integral):
        msg = f"Unsafe cast: Can't promote python int with value ({int(value)}) to dtype({dtype}). " \
              "It would lose precision."
    else:
        msg = f"Unsafe cast: Can't promote python float to dtype({dtype})."
    raise ValueError(f"{msg} ({op}: {arg}={value!r})")


def _seeded(g: Any) -> bool:
    """Whether ``set_seed`` ran in ``g`` or a graph enclosing it (the eager compute graph always is)."""
    while g is not None:
        if getattr(g, "_random_seed", None) is not None:
            return True
        g = getattr(g, "_enclosing", None) or getattr(g, "_parent", None)
    return False


def _require_seed(op: str) -> None:
    if not _seeded(current_graph(op)):
        raise RuntimeError(f"No seed set! Set with `ops.random.set_seed`. ({op})")


def _draw(kind: str, like: TensorType, dtype: DType, attrs: dict) -> Any:
    t = TensorType(dtype, like.shape, like.device)
    return stage1(kind, [], t, {"shape": like.shape, "dtype": dtype, "device": like.device, **attrs})


def gaussian(like: TensorType, mean: Any = 0.0, std: Any = 1.0) -> Any:
    """Normal samples with ``like``'s type (see the module docstring for non-float dtypes).

    RuntimeError before ``set_seed``; ValueError if a number ``std`` is ``<= 0``."""
    from max.graph.ops.elementwise import add, cast, mul

    op = "random.gaussian"
    _require_seed(op)
    like = _check_like(like, op)
    if _is_number(std) and not std > 0:
        fail(op, f"std must be > 0, got {std}")
    dt = like.dtype if like.dtype in _NATIVE else DType.float32
    if _is_number(mean) and _is_number(std):
        z = _draw("random.normal", like, dt, {"mean": float(mean), "std": float(std)})
    else:
        z = add(mul(_draw("random.normal", like, dt, {"mean": 0.0, "std": 1.0}), std), mean)
    return z if z.dtype is like.dtype else cast(z, like.dtype)


normal = gaussian


def uniform(like: TensorType, range: Any = (0, 1)) -> Any:  # noqa: A002 - reference name
    """Uniform samples in ``[range[0], range[1])`` with ``like``'s type.

    ``range`` is two numbers with ``min < max`` (ValueError otherwise, or when a
    number does not fit ``like``'s dtype) or two tensors (values broadcast
    against the samples).  RuntimeError before ``set_seed``.
    """
    from max.graph.ops.elementwise import add, cast, floor, mul, sub

    op = "random.uniform"
    _require_seed(op)
    like = _check_like(like, op)
    try:
        vals = tuple(range)
    except TypeError:
        fail(op, f"range must be a (min, max) pair, got {range!r}")
    if len(vals) != 2:
        fail(op, f"range must have exactly 2 values (min, max), got {len(vals)}: {range!r}")
    dtype = like.dtype
    if dtype in BIT_STORED:
        raise TypeError(f"Cannot create a constant of type '{dtype}' since it is a sub-byte type. ({op})")
    lo, hi = vals
    for name, v in (("min", lo), ("max", hi)):
        if isinstance(v, (numbers.Number,)) and not weak_scalar_fits(v, dtype):
            _unsafe_cast(v, dtype, op, f"range {name}")
    integral = not dtype.is_float()
    if _is_number(lo) and _is_number(hi):
        if not lo < hi:
            fail(op, f"range min must be < max, got min={lo} max={hi}")
        if not integral:
            return _draw("random.uniform", like, dtype, {"low": float(lo), "high": float(hi)})
        # integers in [lo, hi): floor of a float64 draw in [lo, hi); bool (whose only range is
        # (0, 1)) takes both values, a fair coin
        top = float(hi) + (1.0 if dtype is DType.bool else 0.0)
        u = _draw("random.uniform", like, DType.float64, {"low": float(lo), "high": top})
        return cast(floor(u), dtype)
    # tensor bounds: lo + u * (hi - lo), u in [0, 1)
    work = dtype if not integral else DType.float64
    lo_t = as_tensor(lo, op=op, arg="range min", dtype=dtype, device=like.device)
    hi_t = as_tensor(hi, op=op, arg="range max", dtype=dtype, device=like.device)
    u = _draw("random.uniform", like, work, {"low": 0.0, "high": 1.0})
    lo_w, hi_w = cast(lo_t, work), cast(hi_t, work)
    r = add(mul(u, sub(hi_w, lo_w)), lo_w)
    return cast(floor(r), dtype) if integral else r


def set_seed(seed: Any) -> None:
    """Seed the graph's random ops: when the model runs, reseed the generators with ``seed`` (an int
    that fits uint64, or a rank-0 / ``[1]`` tensor of any dtype)."""
    op = "random.set_seed"
    g = current_graph(op)
    if isinstance(seed, bool) or not isinstance(seed, (numbers.Integral,)) and not hasattr(seed, "dtype") \
            and not hasattr(seed, "__tensorvalue__"):
        fail(op, f"seed must be an int or a tensor, got {type(seed).__name__} {seed!r}", TypeError)
    operands = []
    attrs: dict = {}
    if isinstance(seed, numbers.Integral):
        if not weak_scalar_fits(int(seed), DType.uint64):
            _unsafe_cast(int(seed), DType.uint64, op, "seed")
        attrs["seed"] = int(seed)
        value: Any = int(seed)
    else:
        t = as_tensor(seed, op=op, arg="seed")
        if not (t.rank == 0 or t.rank == 1 and t.shape[0] == 1):
            shape = "[" + ", ".join(repr(d) for d in t.shape) + "]"
            raise ValueError(f"Seed must be a scalar or rank-1 tensor with shape [1], got shape {shape}.")
        operands.append(t)
        value = t
    res = g._add_node(op, operands + [g._current_chain], [_ChainType()], attrs, side_effects=True)
    g._current_chain = res[0]
    g._random_seed = value
