"""Graph-level passes over a :class:`Program`: dead-code elimination,
common-subexpression elimination and constant folding."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from max.engine.compiler.program import PNode, Program
from max.engine.kernels import KERNELS
from max.graph.dim import Dim
from max.graph.shape import Shape
from max.graph.type import TensorType

FOLD_MAX_ELEMENTS = 1 << 16
_NEVER_FOLD = {"constant", "weight", "chain", "merge_chains", "input"}


def attr_key(v: Any) -> Any:
    """A hashable, structural key for an attribute value."""
    if isinstance(v, np.ndarray):
        if v.nbytes <= 1 << 16:
            return ("nd", str(v.dtype), v.shape, hashlib.blake2b(v.tobytes(), digest_size=16).digest())
        return ("nd-id", id(v))
    if isinstance(v, dict):
        return tuple(sorted((k, attr_key(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple, Shape)):
        return (type(v).__name__,) + tuple(attr_key(x) for x in v)
    if isinstance(v, slice):
        return ("slice", attr_key(v.start), attr_key(v.stop), attr_key(v.step))
    if isinstance(v, Dim):
        return ("dim", str(v))
    try:
        hash(v)
        return v
    except TypeError:
        return ("id", id(v))


def dce(prog: Program) -> int:
    """Remove nodes whose results are unused and that have no side effects."""
    live = set(prog.output_ids)
    keep: list[PNode] = []
    for n in reversed(prog.nodes):
        spec = KERNELS.get(n.op)
        effectful = n.side_effects or (spec is not None and not spec.pure)
        if effectful or any(o in live for o in n.outs):
            keep.append(n)
            live.update(n.inputs)
    removed = len(prog.nodes) - len(keep)
    keep.reverse()
    prog.nodes = keep
    return removed


def cse(prog: Program) -> int:
    """Merge pure nodes with equal op, operands, attributes and result types."""
    seen: dict[Any, PNode] = {}
    alias: dict[int, int] = {}
    out: list[PNode] = []
    merged = 0
    for n in prog.nodes:
        if alias:
            n.inputs = tuple(alias.get(i, i) for i in n.inputs)
        spec = KERNELS.get(n.op)
        pure = not n.side_effects and n.op not in ("weight", "input", "chain") and (
            n.op == "constant" or (spec is not None and spec.pure)
        ) and not n.regions
        if pure:
            try:
                key = (n.op, n.inputs, attr_key(n.attrs), n.types)
                hash(key)
            except TypeError:
                key = None
            if key is not None:
                prev = seen.get(key)
                if prev is not None:
                    for a, b in zip(n.outs, prev.outs):
                        alias[a] = b
                    merged += 1
                    continue
                seen[key] = n
        out.append(n)
    prog.nodes = out
    if alias:
        prog.output_ids = tuple(alias.get(i, i) for i in prog.output_ids)
    return merged


def fold_constants(prog: Program) -> int:
    """Evaluate pure nodes whose operands are all constants (results up to FOLD_MAX_ELEMENTS)."""
    from max.driver.buffer import numpy_to_torch, torch_to_numpy
    from max.engine.compiler.lower import call_kernel

    consts: dict[int, np.ndarray] = {}
    folded = 0
    out: list[PNode] = []
    for n in prog.nodes:
        if n.op == "constant":
            consts[n.outs[0]] = n.attrs["value"]
            out.append(n)
            continue
        spec = KERNELS.get(n.op)
        if (
            spec is None or not spec.pure or not spec.foldable or n.side_effects or n.regions
            or n.op in _NEVER_FOLD or not n.inputs
            or not all(i in consts for i in n.inputs)
            or not all(isinstance(t, TensorType) and Shape.is_static(t.shape) for t in n.types)
            or any(t.device.is_gpu() for t in n.types)
        ):
            out.append(n)
            continue
        if sum(int(np.prod([int(d) for d in t.shape])) for t in n.types) > FOLD_MAX_ELEMENTS:
            out.append(n)
            continue
        try:
            res, _ = call_kernel(spec, [numpy_to_torch(consts[i], copy=True) for i in n.inputs], n.attrs)
        except Exception:
            out.append(n)  # leave it to run (and report) at execution time
            continue
        results = res if isinstance(res, (tuple, list)) else (res,)
        for o, t, r in zip(n.outs, n.types, results):
            arr = torch_to_numpy(r.to("cpu"), t.dtype).copy()
            arr.setflags(write=False)
            consts[o] = arr
            out.append(PNode("constant", (), {"value": arr}, (t,), (o,), n.loc))
        folded += 1
    prog.nodes = out
    return folded

