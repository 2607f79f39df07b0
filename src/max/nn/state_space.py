"""State-space / recurrent sequence kernels under MAX 26.7's ``max.nn.state_space`` names.

Each is a graph-building function over ragged batches (every request's tokens of this step
concatenated, ``input_row_offsets`` ``[batch + 1]`` delimiting them) with a per-request state kept in
a mutable slot buffer (``state[slots[b]]``), updated in place.  They are libremax's recurrent ops
(``max.graph.ops.recurrent`` / ``gated_rms_norm``) under these names and layouts:

* ``causal_conv1d_varlen_fwd``: depthwise causal conv1d in the channels-first layout
  ``x [dim, total_seq_len]`` (Mamba's), SiLU by default;
* ``short_conv_ring``: the same convolution tokens-first (``x [total_seq_len, dim]``), no activation
  (LFM2's short convolution; the slot is the ring of the last ``kernel_size - 1`` inputs);
* ``gated_delta_recurrence_fwd``: the gated delta rule (Gated DeltaNet / Qwen3-Next);
* ``mamba2_ssd_chunk_scan_varlen_fwd_inplace``: the Mamba-2 SSD scan, optionally writing its result
  into a given buffer;
* ``gated_group_rmsnorm``: RMS norm over channel groups gated by ``silu(gate)`` (Mamba-2, DeltaNet).
"""

from __future__ import annotations

from typing import Any

from max.graph import ops
from max.graph.ops.recurrent import causal_conv1d, gated_delta_rule, selective_scan
from max.graph.value import BufferValue, TensorValue

__all__ = [
    "causal_conv1d_varlen_fwd", "gated_delta_recurrence_fwd", "gated_group_rmsnorm",
    "mamba2_ssd_chunk_scan_varlen_fwd_inplace", "short_conv_ring",
]


def causal_conv1d_varlen_fwd(x: Any, weight: Any, conv_state: Any, cache_indices: Any, query_start_loc: Any,
                             bias: Any = None, activation: str | None = "silu") -> TensorValue:
    """Depthwise causal conv1d over a ragged batch, channels first.

    ``x`` ``[dim, total_seq_len]``, ``weight`` ``[dim, width]``, ``conv_state`` (buffer)
    ``[num_slots, dim, width - 1]`` (request ``b`` starts from ``conv_state[cache_indices[b]]`` and
    leaves its last ``width - 1`` inputs there), ``query_start_loc`` ``[batch + 1]``; ``activation``
    ``"silu"`` (default) or None.  Returns ``[dim, total_seq_len]``.
    """
    y = causal_conv1d(ops.transpose(x, 0, 1), weight, conv_state, cache_indices, query_start_loc, bias=bias,
                      activation=activation)
    return ops.transpose(y, 0, 1)


def short_conv_ring(x: Any, weight: Any, state: Any, slots: Any, input_row_offsets: Any,
                    bias: Any = None) -> TensorValue:
    """Depthwise causal short convolution, tokens first: ``x`` ``[total_seq_len, dim]``, ``weight``
    ``[dim, kernel_size]``, ``state`` (buffer) ``[num_slots, dim, kernel_size - 1]`` holding each request's
    last inputs (oldest first).  No activation.  Returns ``[total_seq_len, dim]``."""
    return causal_conv1d(x, weight, state, slots, input_row_offsets, bias=bias, activation=None)


def gated_delta_recurrence_fwd(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any, slots: Any,
                               input_row_offsets: Any, *, chunk_size: int = 64, A: Any = None, dt_bias: Any = None,
                               beta_sigmoid: bool = False, qk_l2norm: bool = False,
                               scale: float = 1.0) -> TensorValue:
    """The gated delta rule with per-request state: ``S'_t = exp(g_t) S_{t-1}``,
    ``S_t = S'_t + k_t (beta_t (v_t - S'_t^T k_t))^T``, ``o_t = S_t^T q_t``.

    ``q``/``k`` ``[T, Hk, K]``, ``v`` ``[T, H, V]``, ``g``/``beta`` ``[T, H]``, ``state`` (buffer)
    ``[num_slots, H, K, V]``; see ``max.graph.ops.recurrent.gated_delta_rule`` for the optional input
    preparation (``A``/``dt_bias`` gating, ``beta_sigmoid``, ``qk_l2norm``, ``scale``).  Returns ``[T, H, V]``.
    """
    return gated_delta_rule(q, k, v, g, beta, state, slots, input_row_offsets, chunk_size=chunk_size, A=A,
                            dt_bias=dt_bias, beta_sigmoid=beta_sigmoid, qk_l2norm=qk_l2norm, scale=scale)


def mamba2_ssd_chunk_scan_varlen_fwd_inplace(x: Any, dt: Any, A: Any, B: Any, C: Any, state: Any, slots: Any,
                                             input_row_offsets: Any, *, D: Any = None, chunk_size: int = 64,
                                             dt_bias: Any = None, dt_softplus: bool = False,
                                             dt_limit: tuple = (0.0, float("inf")),
                                             out: BufferValue | None = None) -> TensorValue | None:
    """The Mamba-2 SSD scan (chunked within ``chunk_size`` tokens) with per-request state updated in place:
    ``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T``, ``y_t = h_t C_t (+ D x_t)``.

    ``x`` ``[T, H, P]``, ``dt`` ``[T, H]``, ``A`` ``[H]``, ``B``/``C`` ``[T, G, N]``, ``state`` (buffer)
    ``[num_slots, H, P, N]``.  With ``out`` (a buffer ``[T, H, P]``) the result is written into it and
    None is returned; otherwise the result ``[T, H, P]`` is returned.
    """
    y = selective_scan(x, dt, A, B, C, state, slots, input_row_offsets, D=D, chunk_size=chunk_size,
                       dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit)
    if out is None:
        return y
    ops.buffer_store(out, y)
    return None


def gated_group_rmsnorm(x: Any, gate: Any, weight: Any, eps: float = 1e-6, num_groups: int = 1,
                        norm_before_gate: bool = False) -> TensorValue:
    """RMS norm over ``num_groups`` channel groups of the last dim, gated by ``silu(gate)``: after the norm
    with ``norm_before_gate`` (``rmsnorm(x) * silu(gate)``), else before it (``rmsnorm(x * silu(gate))``),
    scaled by ``weight``.  float32."""
    return ops.gated_rms_norm(x, gate, weight, eps, num_groups, norm_before_gate=norm_before_gate)
