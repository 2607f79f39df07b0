"""Recurrent (state-carrying) sequence ops over ragged batches: ``causal_conv1d``,
``selective_scan`` (Mamba-2 SSD) and ``gated_delta_rule`` (gated DeltaNet), libremax extensions.

All three take this step's tokens of every request concatenated (``[total_seq_len, ...]``,
``input_row_offsets`` ``[batch + 1]`` delimiting them, as the paged-attention ops do), a mutable
``state`` buffer of fixed-size per-request slots ``[num_slots, ...]`` and ``slots`` (integer
``[batch]``: request ``b``'s slot).  Each request's tokens are run in order starting from
``state[slots[b]]``, and the state after its last token is written back to that slot, so a prompt
split over several steps (chunked prefill) or decoded one token at a time gives the same result as
one call.  A request with no tokens this step leaves its slot untouched.  The ops consume and produce
the graph chain (like the buffer ops), so state reads and writes stay in program order.

* ``causal_conv1d(x [T, C], weight [C, K], state [S, C, K-1])``: depthwise causal convolution; the
  slot holds the request's last ``K-1`` inputs (oldest first, zeros for a new request):
  ``y[t, c] = bias[c] + sum_k weight[c, k] * xp[c, t + k]`` with ``xp = concat(state, x^T)``;
  ``activation="silu"`` applies SiLU to ``y``.
* ``selective_scan(x [T, H, P], dt [T, H], A [H], B [T, G, N], C [T, G, N], state [S, H, P, N])``:
  ``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T`` (head ``h`` reads group ``h // (H / G)``),
  ``y_t = h_t C_t (+ D x_t)``; ``dt`` is the step size after softplus/clamping, or, with ``dt_bias`` /
  ``dt_softplus=True``, the raw one: the op takes ``clamp(softplus(dt + dt_bias), *dt_limit)``.
* ``gated_delta_rule(q [T, Hk, K], k [T, Hk, K], v [T, H, V], g [T, H], beta [T, H], state [S, H, K, V])``:
  ``S'_t = exp(g_t) S_{t-1}``, ``S_t = S'_t + k_t (beta_t (v_t - S'_t^T k_t))^T``, ``o_t = S_t^T q_t``
  (``g`` is the log decay, ``<= 0``); value head ``h`` reads key head ``h // (H / Hk)``.  The op can
  prepare its inputs itself (Qwen3-Next's gating): ``qk_l2norm`` L2-normalises q and k
  (``x / sqrt(sum x^2 + 1e-6)``), ``scale`` multiplies q after that; with ``A`` [H] the given ``g`` is the
  raw gate input and the log decay is ``A * softplus(g + dt_bias)``; ``beta_sigmoid`` takes
  ``sigmoid(beta)``.

Kernels (``max.engine.kernels.recurrent``) run decode rows with the recurrent form and prompts with a
chunked (parallel within ``chunk_size`` tokens) form.
"""

from __future__ import annotations

from typing import Any

from max.graph.dim import StaticDim
from max.graph.ops._common import as_tensor, current_graph, fail
from max.graph.type import _ChainType
from max.graph.value import BufferValue, TensorValue

__all__ = ["causal_conv1d", "gated_delta_rule", "selective_scan"]


def _chained(op: str, operands: list, result_types: list, attrs: dict) -> list:
    g = current_graph(op)
    res = g._add_node(op, operands + [g._current_chain], result_types + [_ChainType()], attrs, side_effects=True)
    g._current_chain = res[-1]
    return res[:-1]


def _static(d: Any) -> int | None:
    if isinstance(d, int):
        return d
    return d.dim if isinstance(d, StaticDim) else None


def _float(op: str, arg: str, x: Any, rank: int) -> TensorValue:
    t = as_tensor(x, op=op, arg=arg)
    if not t.dtype.is_float():
        fail(op, f"{arg} must be floating point, got {t.dtype}", TypeError)
    if t.rank != rank:
        fail(op, f"{arg} must have rank {rank}, got {t.type}")
    return t


def _ragged(op: str, state: Any, slots: Any, offsets: Any, rank: int) -> tuple[BufferValue, TensorValue, TensorValue]:
    if not isinstance(state, BufferValue):
        fail(op, f"state must be a BufferValue (a BufferType graph input of per-request slots), got "
                 f"{type(state).__name__}", TypeError)
    if state.rank != rank:
        fail(op, f"state must have rank {rank}, got {state.type}")
    if not state.dtype.is_float():
        fail(op, f"state must be floating point, got {state.dtype}", TypeError)
    s = as_tensor(slots, op=op, arg="slots")
    o = as_tensor(offsets, op=op, arg="input_row_offsets")
    for name, t in (("slots", s), ("input_row_offsets", o)):
        if t.rank != 1 or not t.dtype.is_integral():
            fail(op, f"{name} must be a 1-D integer tensor, got {t.type}", TypeError)
    return state, s, o


def _same(op: str, what: str, a: Any, b: Any) -> None:
    """Static dims ``a`` and ``b`` must agree (symbolic ones are checked when the graph runs)."""
    x, y = _static(a), _static(b)
    if x is not None and y is not None and x != y:
        fail(op, f"{what}: {x} != {y}")


def causal_conv1d(x: Any, weight: Any, state: Any, slots: Any, input_row_offsets: Any, bias: Any = None,
                  activation: str | None = None) -> TensorValue:
    """Depthwise causal conv1d with a per-request window (see the module docstring); returns ``[T, C]``."""
    op = "causal_conv1d"
    xt = _float(op, "x", x, 2)
    w = _float(op, "weight", weight, 2)
    st, s, o = _ragged(op, state, slots, input_row_offsets, 3)
    _same(op, "weight channels vs x channels", w.shape[0], xt.shape[1])
    _same(op, "state channels vs x channels", st.shape[1], xt.shape[1])
    k = _static(w.shape[1])
    if k is None or k < 1:
        fail(op, f"weight must be [channels, kernel_size] with a static kernel_size >= 1, got {w.shape}")
    _same(op, "state window vs kernel_size - 1", st.shape[2], k - 1)
    operands = [xt, w, st, s, o]
    if bias is not None:
        b = _float(op, "bias", bias, 1)
        _same(op, "bias vs x channels", b.shape[0], xt.shape[1])
        operands.append(b)
    if activation not in (None, "silu"):
        fail(op, f"activation must be None or 'silu', got {activation!r}")
    (y,) = _chained(op, operands, [xt.type], {"has_bias": bias is not None, "silu": activation == "silu"})
    return y


def selective_scan(x: Any, dt: Any, A: Any, B: Any, C: Any, state: Any, slots: Any, input_row_offsets: Any,
                   D: Any = None, chunk_size: int = 64, dt_bias: Any = None, dt_softplus: bool = False,
                   dt_limit: tuple = (0.0, float("inf"))) -> TensorValue:
    """Mamba-2 SSD scan with per-request state (see the module docstring); returns ``[T, H, P]``."""
    op = "selective_scan"
    xt = _float(op, "x", x, 3)
    dtt = _float(op, "dt", dt, 2)
    a = _float(op, "A", A, 1)
    bt = _float(op, "B", B, 3)
    ct = _float(op, "C", C, 3)
    st, s, o = _ragged(op, state, slots, input_row_offsets, 4)
    T, H, P = xt.shape
    for what, d in (("dt tokens", dtt.shape[0]), ("B tokens", bt.shape[0]), ("C tokens", ct.shape[0])):
        _same(op, f"{what} vs x tokens", d, T)
    _same(op, "dt heads vs x heads", dtt.shape[1], H)
    _same(op, "A heads vs x heads", a.shape[0], H)
    _same(op, "C groups vs B groups", ct.shape[1], bt.shape[1])
    _same(op, "C state size vs B state size", ct.shape[2], bt.shape[2])
    _same(op, "state heads", st.shape[1], H)
    _same(op, "state head_dim", st.shape[2], P)
    _same(op, "state size vs B state size", st.shape[3], bt.shape[2])
    h, g = _static(H), _static(bt.shape[1])
    if h is not None and g is not None and (g < 1 or h % g):
        fail(op, f"heads ({h}) must be a multiple of the B/C groups ({g})")
    operands = [xt, dtt, a, bt, ct, st, s, o]
    if D is not None:
        d = _float(op, "D", D, 1)
        _same(op, "D heads vs x heads", d.shape[0], H)
        operands.append(d)
    if dt_bias is not None:
        db = _float(op, "dt_bias", dt_bias, 1)
        _same(op, "dt_bias heads vs x heads", db.shape[0], H)
        operands.append(db)
    _chunk(op, chunk_size)
    softplus = bool(dt_softplus or dt_bias is not None)
    try:
        lo, hi = (float(v) for v in dt_limit)
    except (TypeError, ValueError):
        fail(op, f"dt_limit must be a pair of floats, got {dt_limit!r}", TypeError)
    if not lo <= hi:
        fail(op, f"dt_limit must be (low, high) with low <= high, got {dt_limit!r}")
    if (lo, hi) != (0.0, float("inf")) and not softplus:
        fail(op, "dt_limit applies to the step size the op computes: give dt_bias or dt_softplus=True")
    (y,) = _chained(op, operands, [xt.type], {"has_d": D is not None, "chunk_size": chunk_size,
                                              "has_dt_bias": dt_bias is not None, "dt_softplus": softplus,
                                              "dt_min": lo, "dt_max": hi})
    return y


def _chunk(op: str, chunk_size: Any) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        fail(op, f"chunk_size must be a positive int, got {chunk_size!r}", TypeError)


def gated_delta_rule(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any, slots: Any, input_row_offsets: Any,
                     chunk_size: int = 64, A: Any = None, dt_bias: Any = None, beta_sigmoid: bool = False,
                     qk_l2norm: bool = False, scale: float = 1.0) -> TensorValue:
    """Gated delta rule with per-request state (see the module docstring); returns ``[T, H, V]``."""
    op = "gated_delta_rule"
    qt = _float(op, "q", q, 3)
    kt = _float(op, "k", k, 3)
    vt = _float(op, "v", v, 3)
    gt = _float(op, "g", g, 2)
    bt = _float(op, "beta", beta, 2)
    st, s, o = _ragged(op, state, slots, input_row_offsets, 4)
    T, Hk, K = qt.shape
    H = vt.shape[1]
    for i, d in enumerate(kt.shape):
        _same(op, "k vs q shape", d, qt.shape[i])
    _same(op, "v tokens vs q tokens", vt.shape[0], T)
    h, hk = _static(H), _static(Hk)
    if h is not None and hk is not None and (hk < 1 or h % hk):
        fail(op, f"v heads ({h}) must be a multiple of the q/k heads ({hk})")
    for name, t in (("g", gt), ("beta", bt)):
        _same(op, f"{name} tokens vs q tokens", t.shape[0], T)
        _same(op, f"{name} heads vs v heads", t.shape[1], H)
    _same(op, "state heads", st.shape[1], H)
    _same(op, "state key dim", st.shape[2], K)
    _same(op, "state value dim", st.shape[3], vt.shape[2])
    _chunk(op, chunk_size)
    operands = [qt, kt, vt, gt, bt, st, s, o]
    if A is not None:
        at = _float(op, "A", A, 1)
        _same(op, "A heads vs v heads", at.shape[0], H)
        operands.append(at)
    if dt_bias is not None:
        if A is None:
            fail(op, "dt_bias is added to the raw gate input: give A too")
        db = _float(op, "dt_bias", dt_bias, 1)
        _same(op, "dt_bias heads vs v heads", db.shape[0], H)
        operands.append(db)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        fail(op, f"scale must be a float, got {scale!r}", TypeError)
    (y,) = _chained(op, operands, [vt.type], {"chunk_size": chunk_size, "has_a": A is not None,
                                              "has_dt_bias": dt_bias is not None, "beta_sigmoid": bool(beta_sigmoid),
                                              "qk_l2norm": bool(qk_l2norm), "scale": float(scale)})
    return y
