"""Fusion of projections: ``x @ Wᵀ`` forms into one ``fused_matmul_t`` node.

``fused_matmul_t(x, W_1..W_n, b_i...)`` computes ``concat_i(x @ W_iᵀ (+ b_i))``
for weights in their checkpoint layout ``[N_i, K]`` -- dense (any float dtype)
or GGML block-quantised (``qmatmul``) -- and optionally a gated activation
``act(y[..., :N]) * y[..., N:]`` of two of them.  It is formed from:

- ``matmul(x, transpose(W))`` (a ``Linear``), also through an exact widening
  ``cast`` of a bfloat16/float16 ``W`` to the activations' float32 (the kernel
  widens on the fly instead of keeping a float32 copy), and ``qmatmul(x, W)``;
- ``+ b`` on a single projection;
- ``concat([P_1(x), ..., P_n(x)], axis=-1)`` of projections of the same ``x``
  (q/k/v: one call, weights never concatenated in memory, encodings may differ);
- ``silu(P_1(x)) * P_2(x)`` and ``gelu(P_1(x)) * P_2(x)`` (gated MLPs);
- ``P(rms_norm(h))`` when the norm feeds only the projection (``prenorm``, run after the norm
  patterns are fused): the kernel normalises ``h`` itself (one call instead of two).

Because the weight stays ``[N, K]``, load-time folding no longer makes a
transposed copy of every projection.
"""

from __future__ import annotations

from typing import Any

from max.dtype import DType
from max.engine.compiler.program import PNode

OP = "fused_matmul_t"


def _static(d: Any) -> int | None:
    return int(d) if hasattr(d, "dim") else None


def _swaps_last_two(n: PNode, rank: int) -> bool:
    if rank != 2:
        return False
    if n.op == "transpose":
        return {a % 2 for a in (n.attrs["axis_1"], n.attrs["axis_2"])} == {0, 1}
    if n.op == "permute":
        return [d % 2 for d in n.attrs["dims"]] == [1, 0]
    return False


def _node(like: PNode, x: int, weights: list[int], biases: list[int], kinds: tuple, ns: tuple, k: int,
          has_bias: tuple, act: str | None) -> PNode:
    attrs = {"kinds": kinds, "ns": ns, "k": k, "has_bias": has_bias, "act": act}
    return PNode(OP, (x, *weights, *biases), attrs, like.types, like.outs, like.loc)


def parts(n: PNode) -> tuple[int, list[int], list[int]]:
    """(x, weights, biases) of a fused_matmul_t node (a fused norm's weight, if any, is not included)."""
    nw = len(n.attrs["kinds"])
    nb = sum(n.attrs["has_bias"])
    return n.inputs[0], list(n.inputs[1:1 + nw]), list(n.inputs[1 + nw:1 + nw + nb])


def norm_operand(n: PNode) -> list[int]:
    """The fused RMSNorm's weight operand (``[]`` without one)."""
    start = 1 + len(n.attrs["kinds"]) + sum(n.attrs["has_bias"])
    return list(n.inputs[start:start + (n.attrs.get("norm_eps") is not None)])


def projection(v: Any, n: PNode) -> PNode | None:
    """``matmul(x, transpose(W))`` or ``qmatmul(x, W)`` -> fused_matmul_t."""
    if n.op == "qmatmul":
        x, w = n.inputs
        k = _static(v.shape(x)[-1])
        rows = _static(v.shape(w)[0])
        if k is None or rows is None:
            return None
        return _node(n, x, [w], [], (str(n.attrs["encoding"]).upper(),), (rows,), k, (False,), None)
    if n.op != "matmul":
        return None
    x, wt = n.inputs
    if v.rank(wt) != 2 or v.rank(x) < 1 or not v.single(wt):
        return None
    t = v.node(wt, ("transpose", "permute"))
    if t is None or not _swaps_last_two(t, 2):
        return None
    w = t.inputs[0]
    x_dt = v.prog.types[x].dtype
    if not x_dt.is_float():
        return None
    c = v.node(w, "cast")
    if c is not None and v.single(w):
        src = v.prog.types[c.inputs[0]].dtype
        if x_dt is DType.float32 and src in (DType.bfloat16, DType.float16):
            w = c.inputs[0]  # exact widening: the kernel reads the narrow weight
    rows, k = _static(v.shape(w)[0]), _static(v.shape(w)[1])
    if rows is None or k is None:
        return None
    return _node(n, x, [w], [], ("dense",), (rows,), k, (False,), None)


def bias(v: Any, n: PNode) -> PNode | None:
    """``fused_matmul_t(x, W) + b`` -> one node with a bias."""
    if n.op != "add":
        return None
    for a, b in (n.inputs, n.inputs[::-1]):
        f = v.node(a, OP)
        if f is None or not v.single(a) or len(f.attrs["kinds"]) != 1 or f.attrs["has_bias"][0] or f.attrs["act"]:
            continue
        if v.rank(b) != 1 or _static(v.shape(b)[0]) != f.attrs["ns"][0]:
            continue
        if v.prog.types[b].dtype != v.prog.types[n.outs[0]].dtype or list(v.shape(a)) != list(v.shape(n.outs[0])):
            continue
        x, ws, _ = parts(f)
        return _node(n, x, ws, [b], f.attrs["kinds"], f.attrs["ns"], f.attrs["k"], (True,), None)
    return None


def _merge(v: Any, like: PNode, ids: list[int], act: str | None) -> PNode | None:
    nodes = []
    for i in ids:
        f = v.node(i, OP)
        if f is None or not v.single(i) or f.attrs["act"]:
            return None
        nodes.append(f)
    if len({f.inputs[0] for f in nodes}) != 1 or len({f.attrs["k"] for f in nodes}) != 1:
        return None
    ws: list[int] = []
    bs: list[int] = []
    kinds: tuple = ()
    ns: tuple = ()
    hb: tuple = ()
    for f in nodes:
        _, w, b = parts(f)
        ws += w
        bs += b
        kinds += f.attrs["kinds"]
        ns += f.attrs["ns"]
        hb += f.attrs["has_bias"]
    return _node(like, nodes[0].inputs[0], ws, bs, kinds, ns, nodes[0].attrs["k"], hb, act)


def concat(v: Any, n: PNode) -> PNode | None:
    """``concat([P_1(x), ..., P_n(x)], axis=-1)`` -> one node."""
    if n.op != "concat" or len(n.inputs) < 2:
        return None
    rank = v.rank(n.outs[0])
    if n.attrs.get("axis") not in (-1, rank - 1):
        return None
    return _merge(v, n, list(n.inputs), None)


def glu(v: Any, n: PNode) -> PNode | None:
    """``act(P_1(x)) * P_2(x)`` -> one node computing both projections and the gate."""
    if n.op != "mul":
        return None
    for g, u in (n.inputs, n.inputs[::-1]):
        a = v.node(g, ("silu", "gelu"))
        if a is None or not v.single(g) or list(v.shape(a.inputs[0])) != list(v.shape(u)):
            continue
        if a.op == "silu":
            act = "silu"
        else:
            appr = a.attrs.get("approximate", "none")
            act = "gelu_tanh" if appr == "tanh" else "gelu" if appr in ("none", None) else None
        if act is None:
            continue
        merged = _merge(v, n, [a.inputs[0], u], act)
        if merged is not None and len(merged.attrs["kinds"]) == 2:
            return merged
    return None


def prenorm(v: Any, n: PNode) -> PNode | None:
    """``fused_matmul_t(fused_rms_norm(h, g))`` -> ``fused_matmul_t(h, ..., g)`` with ``norm_eps``."""
    if n.op != OP or "norm_eps" in n.attrs:
        return None
    x = n.inputs[0]
    r = v.node(x, "fused_rms_norm")
    if r is None or not v.single(x) or len(r.inputs) != 2:
        return None
    h, g = r.inputs
    if v.rank(g) != 1 or v.prog.types[g].dtype != v.prog.types[h].dtype:
        return None
    attrs = dict(n.attrs, norm_eps=float(r.attrs.get("eps", 1e-6)))
    return PNode(OP, (h, *n.inputs[1:], g), attrs, n.types, n.outs, n.loc)


RULES = (projection, bias, concat, glu)
LATE_RULES = (prenorm,)
