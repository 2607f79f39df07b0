"""Pattern fusion: rewrite common subgraphs into one kernel call.

Patterns (each only when the intermediate values have no other use):

- projections ``x @ Wᵀ`` / ``qmatmul`` (with bias, several of the same ``x``
  concatenated, or gated by silu/gelu) -> ``fused_matmul_t`` (see
  ``linear_fusion.py``);
- ``matmul(x, w) + b`` (``b`` broadcast along the last dim) and an optional
  following ``relu``/``gelu``/``silu``/``sigmoid``/``tanh`` -> ``fused_linear``;
- ``silu(x @ w1) * (x @ w3)`` -> ``fused_swiglu`` (one allocation, in-place gate);
- ``x * rsqrt(mean(x * x, -1) + eps) [* w]`` -> ``fused_rms_norm``;
- ``softmax((q @ kᵀ) * s [+ mask]) @ v`` (scale as mul/div by a constant,
  on the scores or on q) -> ``fused_attention`` (torch SDPA).

The fused nodes keep the root node's result ids, so everything downstream is
untouched; the now-unused intermediate nodes are removed by DCE.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from max.engine.compiler import linear_fusion
from max.engine.compiler.program import PNode, Program
from max.graph.type import TensorType

_ACTS = {"relu", "gelu", "silu", "sigmoid", "tanh"}


class _View:
    def __init__(self, prog: Program) -> None:
        self.prog = prog
        self.producer: dict[int, PNode] = {}
        for n in prog.nodes:
            for o in n.outs:
                self.producer[o] = n
        uses: Counter = Counter()
        for n in prog.nodes:
            uses.update(n.inputs)
        uses.update(prog.output_ids)
        self.uses = uses

    def single(self, vid: int) -> bool:
        return self.uses[vid] == 1

    def node(self, vid: int, op: str | tuple) -> PNode | None:
        n = self.producer.get(vid)
        if n is None:
            return None
        if isinstance(op, str):
            return n if n.op == op else None
        return n if n.op in op else None

    def const(self, vid: int) -> np.ndarray | None:
        n = self.producer.get(vid)
        if n is not None and n.op == "constant":
            return n.attrs["value"]
        return None

    def rank(self, vid: int) -> int:
        t = self.prog.types.get(vid)
        return len(t.shape) if isinstance(t, TensorType) else -1

    def shape(self, vid: int) -> Any:
        return self.prog.types[vid].shape


def _scalar(arr: np.ndarray | None) -> float | None:
    if arr is None or arr.size != 1:
        return None
    return float(arr.reshape(-1)[0])


def fuse(prog: Program) -> dict[str, int]:
    """Apply every pattern; returns counts per fused kernel."""
    counts: Counter = Counter()
    for rule in (*linear_fusion.RULES, _attention, _swiglu, _rms_norm, _linear, *linear_fusion.LATE_RULES):
        v = _View(prog)
        out = []
        # Walk from the outputs back so the outermost match wins; nodes that a
        # fusion left without users are dropped on the way (online DCE), so
        # their interiors are never matched again.
        for n in reversed(prog.nodes):
            if n.outs and all(v.uses[o] == 0 for o in n.outs) and not n.side_effects and n.op not in _KEEP:
                for i in n.inputs:
                    v.uses[i] -= 1
                continue
            new = rule(v, n)
            if new is not None:
                # a rule that refines an already fused node counts under its own name
                counts[new.op if new.op != n.op else f"{new.op}+{rule.__name__}"] += 1
                for i in n.inputs:
                    v.uses[i] -= 1
                for i in new.inputs:
                    v.uses[i] += 1
                out.append(new)
            else:
                out.append(n)
        out.reverse()
        prog.nodes = out
    return dict(counts)


_KEEP = {"input", "chain", "merge_chains", "weight"}


def _fused(op: str, like: PNode, inputs: list[int], attrs: dict) -> PNode:
    return PNode(op, tuple(inputs), attrs, like.types, like.outs, like.loc)


# -------------------------------------------------------------- linear (+bias, +act)
def _linear_parts(v: _View, vid: int) -> tuple | None:
    """(x, w, bias or None) when vid = matmul(x, w) [+ b]."""
    add = v.node(vid, "add")
    if add is not None:
        for mm_id, b_id in (add.inputs, add.inputs[::-1]):
            mm = v.node(mm_id, "matmul")
            if mm is None or not v.single(mm_id) or v.rank(mm.inputs[0]) < 2 or v.rank(mm.inputs[1]) != 2:
                continue
            if v.rank(b_id) == 1 and v.shape(b_id)[0] == v.shape(mm_id)[-1]:
                return mm.inputs[0], mm.inputs[1], b_id
        return None
    return None


def _linear(v: _View, n: PNode) -> PNode | None:
    if n.op in _ACTS and len(n.inputs) == 1 and v.single(n.inputs[0]):
        parts = _linear_parts(v, n.inputs[0])
        if parts is not None:
            x, w, b = parts
            return _fused("fused_linear", n, [x, w, b], {"act": n.op, "approximate": n.attrs.get("approximate", "none")})
        return None
    if n.op == "add":
        parts = _linear_parts(v, n.outs[0])
        if parts is not None:
            x, w, b = parts
            return _fused("fused_linear", n, [x, w, b], {"act": None, "approximate": "none"})
    return None


# -------------------------------------------------------------- swiglu
def _swiglu(v: _View, n: PNode) -> PNode | None:
    if n.op != "mul":
        return None
    for g_id, u_id in (n.inputs, n.inputs[::-1]):
        s = v.node(g_id, "silu")
        if s is None or not v.single(g_id):
            continue
        a = v.node(s.inputs[0], "matmul")
        b = v.node(u_id, "matmul")
        if a is None or b is None or not v.single(s.inputs[0]) or not v.single(u_id):
            continue
        if a.inputs[0] != b.inputs[0] or v.rank(a.inputs[1]) != 2 or v.rank(b.inputs[1]) != 2:
            continue
        if v.shape(s.inputs[0]) != v.shape(u_id):
            continue
        return _fused("fused_swiglu", n, [a.inputs[0], a.inputs[1], b.inputs[1]], {})
    return None


# -------------------------------------------------------------- rms norm
def _rms_core(v: _View, vid: int) -> tuple | None:
    """(x, eps) when vid = x * rsqrt(mean(x*x, -1) + eps) (either operand order)."""
    m = v.node(vid, "mul")
    if m is None:
        return None
    for x_id, r_id in (m.inputs, m.inputs[::-1]):
        r = v.node(r_id, "rsqrt")
        if r is None or not v.single(r_id):
            continue
        add = v.node(r.inputs[0], "add")
        if add is None or not v.single(r.inputs[0]):
            continue
        for mean_id, eps_id in (add.inputs, add.inputs[::-1]):
            eps = _scalar(v.const(eps_id))
            mean = v.node(mean_id, "mean")
            if eps is None or mean is None or not v.single(mean_id):
                continue
            rank = v.rank(x_id)
            if mean.attrs.get("axis") not in (-1, rank - 1):
                continue
            sq = v.node(mean.inputs[0], ("mul", "pow"))
            if sq is None or not v.single(mean.inputs[0]):
                continue
            if sq.op == "mul" and sq.inputs == (x_id, x_id):
                return x_id, eps
            if sq.op == "pow" and sq.inputs[0] == x_id and _scalar(v.const(sq.inputs[1])) == 2.0:
                return x_id, eps
    return None


def _rms_norm(v: _View, n: PNode) -> PNode | None:
    if n.op != "mul":
        return None
    for core_id, w_id in (n.inputs, n.inputs[::-1]):
        if not v.single(core_id):
            continue
        core = _rms_core(v, core_id)
        if core is None:
            continue
        x, eps = core
        if v.rank(w_id) == 1 and v.shape(w_id)[0] == v.shape(x)[-1]:
            return _fused("fused_rms_norm", n, [x, w_id], {"eps": eps})
    core = _rms_core(v, n.outs[0])
    if core is not None:
        x, eps = core
        return _fused("fused_rms_norm", n, [x], {"eps": eps})
    return None


# -------------------------------------------------------------- attention
def _scaled(v: _View, vid: int) -> tuple[int, float]:
    """Strip a constant scalar mul/div: returns (inner id, scale)."""
    n = v.node(vid, ("mul", "div"))
    if n is not None and v.single(vid):
        for a, c in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])) if n.op == "mul" else ((n.inputs[0], n.inputs[1]),):
            s = _scalar(v.const(c))
            if s is not None and s != 0:
                return a, (s if n.op == "mul" else 1.0 / s)
    return vid, 1.0


def _is_last_two_transpose(n: PNode, rank: int) -> bool:
    if n.op == "transpose":
        axes = {a % rank for a in (n.attrs["axis_1"], n.attrs["axis_2"])}
        return axes == {rank - 1, rank - 2}
    if n.op == "permute":
        dims = [d % rank for d in n.attrs["dims"]]
        return dims == list(range(rank - 2)) + [rank - 1, rank - 2]
    return False


def _attention(v: _View, n: PNode) -> PNode | None:
    if n.op != "matmul":
        return None
    p_id, val = n.inputs
    sm = v.node(p_id, "softmax")
    if sm is None or not v.single(p_id) or sm.attrs.get("axis", -1) not in (-1, v.rank(p_id) - 1):
        return None
    s_id = sm.inputs[0]
    if not v.single(s_id):
        return None
    mask = None
    add = v.node(s_id, "add")
    if add is not None:
        a0, a1 = add.inputs
        inner0, sc0 = _scaled(v, a0)
        if v.node(inner0, "matmul") is not None:
            scores_id, mask = a0, a1
        else:
            scores_id, mask = a1, a0
    else:
        scores_id = s_id
    inner, scale = _scaled(v, scores_id)
    qk = v.node(inner, "matmul")
    if qk is None or not v.single(inner) or (add is not None and not v.single(scores_id)):
        return None
    q_id, kt_id = qk.inputs
    rank = v.rank(q_id)
    if rank < 2 or v.rank(kt_id) != rank or v.rank(val) != rank:
        return None
    q_inner, q_scale = _scaled(v, q_id)
    kt = v.node(kt_id, ("transpose", "permute"))
    if kt is None or not v.single(kt_id) or not _is_last_two_transpose(kt, rank):
        return None
    k_id = kt.inputs[0]
    total = scale * q_scale
    t_q, t_k, t_v = (v.prog.types[i] for i in (q_inner, k_id, val))
    if not (t_q.dtype == t_k.dtype == t_v.dtype) or not t_q.dtype.is_float():
        return None
    if list(t_q.shape[:-2]) != list(t_k.shape[:-2]) or list(t_k.shape[:-2]) != list(t_v.shape[:-2]):
        return None  # SDPA needs equal batch dims
    inputs = [q_inner, k_id, val] + ([mask] if mask is not None else [])
    if mask is not None and v.prog.types[mask].dtype != t_q.dtype:
        return None
    return _fused("fused_attention", n, inputs, {"scale": total})
