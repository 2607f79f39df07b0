"""Mixture of experts: ``MoEGate`` (router), ``MoE`` (routed experts, optional shared experts), and the two
graph ops they stage.

- :func:`moe_route` -- ``[tokens, experts]`` router logits -> ``(expert ids [tokens, k] int64,
  weights [tokens, k] float32)``: softmax then top-k (Mixtral, Qwen3-MoE, DeepSeek), or top-k of the
  logits then softmax over those (GPT-OSS); optional renormalisation, scaling, and DeepSeek's
  group-limited selection (``n_group`` groups, the best ``topk_group`` of them by their best expert).
- :func:`moe_experts_ffn` -- the routed experts' gated MLPs as grouped matmuls: token/expert pairs are
  sorted by expert and each expert with tokens runs one matmul over its rows (no loop over tokens).
  Expert weights are stacked: ``gate``/``up`` ``[experts, moe_dim, hidden]``, ``down``
  ``[experts, hidden, moe_dim]`` (optional biases ``[experts, out]``).  Activations: ``silu``
  (SwiGLU), ``gelu_tanh``, ``gelu``, ``swigluoai`` (GPT-OSS: clamped, ``(up + 1) * g * sigmoid(alpha g)``).

Their building blocks are ``max.nn.kernels``' MoE entry points, defined here and run by the same
kernels :func:`moe_experts_ffn` uses:

- :func:`moe_create_indices` -- group the ``(token, slot)`` pairs of ``topk_ids`` by expert;
- :func:`grouped_matmul_ragged` -- one matmul per active expert over its rows of the grouped order.

Kernels: ``max.engine.kernels.moe``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from max.dtype import DType
from max.graph import DeviceRef, TensorType, TensorValue, ops
from max.graph.ops._common import as_tensor, fail, stage
from max.nn.layer import LayerList, Module
from max.nn.linear import MLP, Linear

__all__ = ["MoE", "MoEGate", "grouped_matmul_ragged", "moe_create_indices", "moe_experts_ffn", "moe_route"]

_ROUTING = ("softmax_topk", "topk_softmax")
_ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "swigluoai")


def moe_route(logits: Any, k: int, *, routing: str = "softmax_topk", renormalize: bool = False,
              scaling: float = 1.0, n_group: int = 1, topk_group: int = 1) -> tuple[TensorValue, TensorValue]:
    """Pick ``k`` experts per token from router ``logits`` ``[tokens, experts]`` (see the module docstring)."""
    op = "moe_route"
    lg = as_tensor(logits, op=op, arg="logits")
    if lg.rank != 2 or not lg.dtype.is_float():
        fail(op, f"logits must be a float [tokens, experts] tensor, got {lg.type}")
    n = int(lg.shape[1])
    if not isinstance(k, int) or not 1 <= k <= n:
        fail(op, f"k must be an int in [1, {n}], got {k!r}")
    if routing not in _ROUTING:
        fail(op, f"routing must be one of {_ROUTING}, got {routing!r}")
    if n_group < 1 or n % n_group or not 1 <= topk_group <= n_group or k > topk_group * (n // n_group):
        fail(op, f"n_group {n_group} / topk_group {topk_group} do not fit {n} experts and k={k}")
    ids_t = TensorType(DType.int64, [lg.shape[0], k], lg.device)
    w_t = TensorType(DType.float32, [lg.shape[0], k], lg.device)
    res = stage(op, [lg], [ids_t, w_t], {"k": k, "routing": routing, "renormalize": bool(renormalize),
                                         "scaling": float(scaling), "n_group": int(n_group),
                                         "topk_group": int(topk_group), "_multi": True})
    return res[0], res[1]


def moe_experts_ffn(x: Any, expert_ids: Any, expert_weights: Any, gate: Any, up: Any, down: Any, *,
                    gate_bias: Any = None, up_bias: Any = None, down_bias: Any = None,
                    activation: str = "silu", swiglu_alpha: float = 1.702, swiglu_limit: float = 7.0) -> TensorValue:
    """``sum_j weights[t, j] * down_e(act(gate_e(x_t), up_e(x_t)))`` over each token's experts ``e = ids[t, j]``."""
    op = "moe_experts_ffn"
    xv = as_tensor(x, op=op, arg="x")
    ids = as_tensor(expert_ids, op=op, arg="expert_ids")
    w = as_tensor(expert_weights, op=op, arg="expert_weights")
    g, u, d = (as_tensor(t, op=op, arg=a) for t, a in ((gate, "gate"), (up, "up"), (down, "down")))
    if xv.rank != 2:
        fail(op, f"x must be [tokens, hidden], got {xv.shape}")
    if ids.rank != 2 or not ids.dtype.is_integral() or w.rank != 2 or ids.shape != w.shape:
        fail(op, f"expert_ids (integer) and expert_weights must both be [tokens, k], got {ids.type} and {w.type}")
    if g.rank != 3 or u.shape != g.shape or d.rank != 3:
        fail(op, f"gate/up must be [experts, moe_dim, hidden] and down [experts, hidden, moe_dim], got "
                 f"{g.shape}, {u.shape}, {d.shape}")
    E, inter, hidden = (int(s) for s in g.shape)
    if int(xv.shape[1]) != hidden or [int(s) for s in d.shape] != [E, hidden, inter]:
        fail(op, f"x [tokens, {xv.shape[1]}] and down {d.shape} do not fit gate [{E}, {inter}, {hidden}]")
    if activation not in _ACTIVATIONS:
        fail(op, f"activation must be one of {_ACTIVATIONS}, got {activation!r}")
    for t in (g, u, d):
        if t.dtype != xv.dtype:
            fail(op, f"expert weights ({t.dtype}) and x ({xv.dtype}) must have the same dtype", TypeError)
    operands = [xv, ids, w, g, u, d]
    present = []
    for name, b, size in (("gate_bias", gate_bias, inter), ("up_bias", up_bias, inter), ("down_bias", down_bias, hidden)):
        if b is not None:
            bv = as_tensor(b, op=op, arg=name)
            if [int(s) for s in bv.shape] != [E, size]:
                fail(op, f"{name} must be [{E}, {size}], got {bv.shape}")
            operands.append(bv)
        present.append(b is not None)
    return stage(op, operands, [xv.type], {"activation": activation, "alpha": float(swiglu_alpha),
                                          "limit": float(swiglu_limit), "biases": tuple(present)})[0]


def moe_create_indices(topk_ids: Any, num_local_experts: int) -> tuple[TensorValue, TensorValue, TensorValue,
                                                                          TensorValue, TensorValue]:
    """Group the token/expert pairs of ``topk_ids`` ``[tokens, k]`` by expert.

    Returns ``(token_expert_order [tokens*k] uint32, expert_start_indices [num_local_experts + 1] uint32,
    restore_token_order [tokens*k] uint32, expert_ids [num_local_experts] int32, expert_usage_stats [2]
    uint32)``: the flat pair indices sorted by expert (stable), where each active expert's rows start in
    that order (entries past the last active expert hold ``tokens*k``), the inverse permutation, the
    active experts' ids (then -1), and (most rows of one expert, number of active experts)."""
    op = "moe_create_indices"
    ids = as_tensor(topk_ids, op=op, arg="topk_ids")
    if ids.rank not in (1, 2) or not ids.dtype.is_integral():
        fail(op, f"topk_ids must be an integer [tokens, k] tensor, got {ids.type}")
    if not isinstance(num_local_experts, int) or num_local_experts < 1:
        fail(op, f"num_local_experts must be a positive int, got {num_local_experts!r}")
    n = ids.shape[0] * ids.shape[1] if ids.rank == 2 else ids.shape[0]
    dev = ids.device
    u32 = DType.uint32
    res = stage(op, [ids], [TensorType(u32, [n], dev), TensorType(u32, [num_local_experts + 1], dev),
                            TensorType(u32, [n], dev), TensorType(DType.int32, [num_local_experts], dev),
                            TensorType(u32, [2], dev)],
                {"num_experts": num_local_experts, "_multi": True})
    return res[0], res[1], res[2], res[3], res[4]


def grouped_matmul_ragged(hidden_states: Any, weight: Any, expert_start_indices: Any, expert_ids: Any,
                          expert_usage_stats_host: Any) -> TensorValue:
    """``out[rows of group i] = hidden_states[rows of group i] @ weight[expert_ids[i]].T`` for the
    ``expert_usage_stats_host[1]`` active groups (rows ``expert_start_indices[i] ..
    expert_start_indices[i + 1]``), as :func:`moe_create_indices` lays them out; ``weight`` is
    ``[experts, out, in]``; rows in no group are zero."""
    op = "grouped_matmul_ragged"
    x = as_tensor(hidden_states, op=op, arg="hidden_states")
    w = as_tensor(weight, op=op, arg="weight")
    st = as_tensor(expert_start_indices, op=op, arg="expert_start_indices")
    eid = as_tensor(expert_ids, op=op, arg="expert_ids")
    stats = as_tensor(expert_usage_stats_host, op=op, arg="expert_usage_stats_host")
    if x.rank != 2 or w.rank != 3 or w.shape[2] != x.shape[1]:
        fail(op, f"hidden_states must be [rows, in] and weight [experts, out, in], got {x.shape} and {w.shape}")
    if x.dtype != w.dtype:
        fail(op, f"hidden_states ({x.dtype}) and weight ({w.dtype}) must have the same dtype", TypeError)
    for t, name in ((st, "expert_start_indices"), (eid, "expert_ids"), (stats, "expert_usage_stats_host")):
        if t.rank != 1 or not t.dtype.is_integral():
            fail(op, f"{name} must be a 1-D integer tensor, got {t.type}")
    if int(stats.shape[0]) != 2:
        fail(op, f"expert_usage_stats_host must be [2] (max rows per expert, active experts), got {stats.shape}")
    return stage(op, [x, w, st, eid, stats], [TensorType(x.dtype, [x.shape[0], w.shape[1]], x.device)], {})[0]


class MoEGate(Module):
    """The router: ``gate_score`` (``Linear(hidden_dim, num_experts)``) then :func:`moe_route`.

    ``__call__(x)`` returns ``(expert ids [tokens, k], weights [tokens, k])``.  The keyword-only options
    (libremax extension) choose the routing: ``routing``, ``renormalize``, ``scaling``, ``n_group``,
    ``topk_group``, ``has_bias``.
    """

    def __init__(self, devices: Sequence[DeviceRef], hidden_dim: int, num_experts: int, num_experts_per_token: int,
                 dtype: DType, is_sharding: bool = False, linear_cls: Callable[..., Linear] = Linear, *,
                 routing: str = "softmax_topk", renormalize: bool = False, scaling: float = 1.0, n_group: int = 1,
                 topk_group: int = 1, has_bias: bool = False) -> None:
        super().__init__()
        if not 1 <= num_experts_per_token <= num_experts:
            raise ValueError(f"MoEGate: num_experts_per_token must be in [1, {num_experts}], "
                             f"got {num_experts_per_token}")
        self.devices = list(devices) or [DeviceRef.CPU()]
        self.hidden_dim, self.num_experts, self.num_experts_per_token = hidden_dim, num_experts, num_experts_per_token
        self.dtype = dtype
        self.routing = dict(routing=routing, renormalize=renormalize, scaling=scaling, n_group=n_group,
                            topk_group=topk_group)
        if not is_sharding:
            self.gate_score = linear_cls(hidden_dim, num_experts, dtype, self.devices[0], has_bias=has_bias)

    def __call__(self, x: TensorValue) -> tuple[TensorValue, TensorValue]:
        return moe_route(self.gate_score(x), self.num_experts_per_token, **self.routing)


class MoE(Module):
    """Mixture of experts: routed gated-MLP experts (grouped matmuls) plus optional shared experts.

    As in MAX, ``experts`` is a ``LayerList`` of ``mlp_cls`` (weights ``experts.{i}.gate_proj.weight``
    ...); ``gate_up_proj`` / ``down_proj`` stack them (the stacking is folded at load).  Subclasses
    that hold expert weights stacked already override :meth:`expert_weights`.
    ``apply_router_weight_first`` scales each token's input by its routing weight instead of the
    expert's output (Llama-4 style; only with ``num_experts_per_token == 1``).
    """

    def __init__(self, devices: Sequence[DeviceRef], hidden_dim: int, num_experts: int, num_experts_per_token: int,
                 moe_dim: int, num_logical_experts: int | None = None, gate_cls: Callable[..., MoEGate] = MoEGate,
                 mlp_cls: Callable[..., MLP] = MLP, shared_mlp_cls: Callable[..., MLP] | None = None,
                 has_shared_experts: bool = False, shared_experts_dim: int = 0, ep_size: int = 1,
                 dtype: DType = DType.bfloat16, apply_router_weight_first: bool = False, use_swigluoai: bool = False,
                 swiglu_alpha: float = 0.0, swiglu_limit: float = 0.0, gated_activation_fn: Any = None,
                 pre_expert_norm_cls: Any = None, ep_batch_manager: Any = None, quant_config: Any = None,
                 shared_experts_dtype: DType | None = None, shared_experts_quant_config: Any = None,
                 is_sharding: bool = False, float8_config: Any = None) -> None:
        super().__init__()
        for what, v in (("ep_size", ep_size != 1), ("ep_batch_manager", ep_batch_manager is not None),
                        ("quant_config", quant_config is not None), ("float8_config", float8_config is not None),
                        ("pre_expert_norm_cls", pre_expert_norm_cls is not None)):
            if v:
                raise NotImplementedError(f"MoE: {what} is not supported yet")
        if apply_router_weight_first and num_experts_per_token != 1:
            raise ValueError("MoE: apply_router_weight_first needs num_experts_per_token == 1")
        self.devices = list(devices) or [DeviceRef.CPU()]
        self.hidden_dim, self.num_experts, self.num_experts_per_token = hidden_dim, num_experts, num_experts_per_token
        self.moe_dim = moe_dim
        self.dtype = dtype
        self.apply_router_weight_first = apply_router_weight_first
        self.activation = "swigluoai" if use_swigluoai else (gated_activation_fn or "silu")
        self.swiglu_alpha = swiglu_alpha or 1.702
        self.swiglu_limit = swiglu_limit or 7.0
        self.has_shared_experts = has_shared_experts
        if is_sharding:
            return
        self.gate = gate_cls(self.devices, hidden_dim, num_experts, num_experts_per_token, dtype)
        self.experts = LayerList([mlp_cls(dtype, None, hidden_dim, moe_dim, self.devices) for _ in range(num_experts)])
        if has_shared_experts:
            if shared_experts_dim <= 0:
                raise ValueError("MoE: has_shared_experts needs shared_experts_dim > 0")
            self.shared_experts = (shared_mlp_cls or mlp_cls)(shared_experts_dtype or dtype, None, hidden_dim,
                                                              shared_experts_dim, self.devices)

    @property
    def gate_up_proj(self) -> TensorValue:
        """``[experts, 2 * moe_dim, hidden]``: each expert's gate rows then its up rows."""
        return ops.stack([ops.concat([e.gate_proj.weight, e.up_proj.weight], axis=0) for e in self.experts], axis=0)

    @property
    def down_proj(self) -> TensorValue:
        """``[experts, hidden, moe_dim]``."""
        return ops.stack([e.down_proj.weight for e in self.experts], axis=0)

    def expert_weights(self) -> dict[str, Any]:
        """Keyword arguments of :func:`moe_experts_ffn`: the stacked weights (and biases)."""
        gate = ops.stack([e.gate_proj.weight for e in self.experts], axis=0)
        up = ops.stack([e.up_proj.weight for e in self.experts], axis=0)
        return dict(gate=gate, up=up, down=self.down_proj)

    def route(self, x: TensorValue) -> tuple[TensorValue, TensorValue]:
        return self.gate(x)

    def __call__(self, x: TensorValue) -> TensorValue:
        ids, weights = self.route(x)
        inp = x
        if self.apply_router_weight_first:
            inp = x * weights.cast(x.dtype)
            weights = ops.constant(1.0, DType.float32, x.device).broadcast_to(weights.shape)
        out = moe_experts_ffn(inp, ids, weights, **self.expert_weights(), activation=self.activation,
                              swiglu_alpha=self.swiglu_alpha, swiglu_limit=self.swiglu_limit)
        if self.has_shared_experts:
            out = out + self.shared_experts(x)
        return out
