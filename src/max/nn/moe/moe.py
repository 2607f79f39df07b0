"""Mixture of experts: ``MoEGate`` (router) and ``MoE`` (experts mixed by the router's top-k).

``MoEGate(x)`` with ``x`` ``[tokens, hidden]`` returns ``(topk_idx, topk_weight)``: the
``num_experts_per_token`` experts with the highest router probability
(``softmax(gate_score(x))``, float32) and those probabilities.  ``MoE(x)`` sums the
selected experts' MLP outputs weighted by them (``apply_router_weight_first``: the
weight scales the expert's input instead), plus ``shared_experts(x)`` when
``has_shared_experts``.  Weights: ``gate.gate_score.weight``,
``experts.{i}.{gate,up,down}_proj.weight``, ``shared_experts.*``.

Every expert runs on every token and the router weights (zero for unselected experts)
mix them: exact, and cheap for the small expert counts this CPU engine targets.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, ops
from max.nn.layer import LayerList, Module, check_input
from max.nn.linear import MLP, Linear

__all__ = ["MoE", "MoEGate"]


class MoEGate(Module):
    """The router: top-``num_experts_per_token`` experts per token and their softmax probabilities."""

    def __init__(self, devices: Sequence[DeviceRef], hidden_dim: int, num_experts: int, num_experts_per_token: int,
                 dtype: DType, is_sharding: bool = False, linear_cls: Callable[..., Linear] = Linear) -> None:
        super().__init__()
        if not 1 <= num_experts_per_token <= num_experts:
            raise ValueError(f"MoEGate: num_experts_per_token must be in [1, {num_experts}], "
                             f"got {num_experts_per_token}")
        self.devices = list(devices) if devices else [DeviceRef.CPU()]
        self.hidden_dim = hidden_dim
        self.num_experts = num_experts
        self.num_experts_per_token = num_experts_per_token
        self.dtype = dtype
        self.gate_score = linear_cls(hidden_dim, num_experts, dtype, self.devices[0])

    def __call__(self, hidden_state: Any) -> tuple[TensorValue, TensorValue]:
        x = check_input(self, hidden_state, rank=2, dtype=self.dtype, last_dim=self.hidden_dim)
        probs = ops.softmax(ops.cast(self.gate_score(x), DType.float32))
        weights, idx = ops.top_k(probs, self.num_experts_per_token, axis=-1)
        return idx, weights


class MoE(Module):
    """Mixture of experts over ``[tokens, hidden]`` input (see the module docstring)."""

    def __init__(self, devices: Sequence[DeviceRef], hidden_dim: int, num_experts: int, num_experts_per_token: int,
                 moe_dim: int, num_logical_experts: int | None = None, gate_cls: Callable[..., MoEGate] = MoEGate,
                 mlp_cls: Callable[..., MLP] = MLP, shared_mlp_cls: Callable[..., MLP] | None = None,
                 has_shared_experts: bool = False, shared_experts_dim: int = 0, ep_size: int = 1,
                 dtype: DType = DType.bfloat16, apply_router_weight_first: bool = False, **unsupported: Any) -> None:
        super().__init__()
        used = {k: v for k, v in unsupported.items() if v not in (None, False, 0, 0.0)}
        if used:
            raise NotImplementedError(f"MoE: options {sorted(used)} are not supported by libremax")
        if ep_size != 1:
            raise NotImplementedError("MoE: expert parallelism (ep_size > 1) is not supported by libremax")
        self.devices = list(devices) if devices else [DeviceRef.CPU()]
        self.hidden_dim = hidden_dim
        self.num_experts = num_experts
        self.num_experts_per_token = num_experts_per_token
        self.moe_dim = moe_dim
        self.dtype = dtype
        self.apply_router_weight_first = apply_router_weight_first
        self.has_shared_experts = has_shared_experts
        self.gate = gate_cls(self.devices, hidden_dim, num_experts, num_experts_per_token, dtype)
        self.experts = LayerList([mlp_cls(dtype, None, hidden_dim, moe_dim, self.devices)
                                  for _ in range(num_experts)])
        if has_shared_experts:
            if shared_experts_dim <= 0:
                raise ValueError("MoE: has_shared_experts needs shared_experts_dim > 0")
            self.shared_experts = (shared_mlp_cls or mlp_cls)(dtype, None, hidden_dim, shared_experts_dim,
                                                              self.devices)

    def __call__(self, x: Any) -> TensorValue:
        v = check_input(self, x, rank=2, dtype=self.dtype, last_dim=self.hidden_dim)
        idx, weights = self.gate(v)
        dev = v.device
        # dense [tokens, num_experts] router weights: the top-k probabilities scattered, zeros elsewhere
        zeros = ops.broadcast_to(ops.constant(0.0, DType.float32, dev), [v.shape[0], self.num_experts])
        route = ops.scatter(zeros, weights, idx, axis=1)
        out = None
        for e, expert in enumerate(self.experts):
            w_e = ops.cast(route[:, e:e + 1], self.dtype)
            y = expert(v * w_e) if self.apply_router_weight_first else expert(v) * w_e
            out = y if out is None else out + y
        if self.has_shared_experts:
            out = out + self.shared_experts(v)
        return out
