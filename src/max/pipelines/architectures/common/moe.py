"""Mixture-of-experts MLPs of the decoder families: what a family states (:class:`MoESpec`), the layer
(:class:`DecoderMoE`, a ``max.nn.MoE`` whose weights come from the weight factory), and the adapter
helpers that stack per-expert checkpoint tensors."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch

from max.graph import TensorValue
from max.nn.layer import Module
from max.nn.moe import MoE, moe_route
from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.weights import Derived, WeightFactory

__all__ = ["GGUF_MOE_NAMES", "DecoderMoE", "MoESpec", "stack_experts"]

GGUF_MOE_NAMES = {"ffn_gate_inp": "mlp.gate", "ffn_gate_exps": "mlp.experts.gate_proj",
                  "ffn_up_exps": "mlp.experts.up_proj", "ffn_down_exps": "mlp.experts.down_proj",
                  "ffn_gate_shexp": "mlp.shared_experts.gate_proj", "ffn_up_shexp": "mlp.shared_experts.up_proj",
                  "ffn_down_shexp": "mlp.shared_experts.down_proj"}
"""llama.cpp's per-layer MoE tensor names (router, stacked experts, shared experts) -> module names."""


@dataclass
class MoESpec:
    """A family's mixture of experts (see ``max.nn.moe.moe_route`` for the routing options)."""

    num_experts: int
    top_k: int
    moe_dim: int
    routing: str = "softmax_topk"
    renormalize: bool = False
    scaling: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    router_name: str = "gate"
    """Module name of the router ``Linear`` inside the MLP (``mlp.gate`` / ``mlp.router``)."""
    router_bias: bool = False
    expert_bias: bool = False
    activation: str = "silu"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    shared_dim: int = 0
    """Intermediate size of the always-on shared experts (``mlp.shared_experts``); 0: none."""
    dense_layers: set[int] = field(default_factory=set)
    """Layers whose MLP is a plain gated MLP of the config's ``intermediate_size``."""


class DecoderMoE(MoE):
    """Routed experts (stacked ``{prefix}.experts.{gate,up,down}_proj``) plus optional shared experts."""

    def __init__(self, cfg: DecoderConfig, layer: int, factory: WeightFactory) -> None:
        from max.pipelines.architectures.common.layers import GatedMLP

        Module.__init__(self)
        spec: MoESpec = cfg.moe
        p = f"layers.{layer}.mlp"
        H, E, inter = cfg.hidden_size, spec.num_experts, spec.moe_dim
        self.spec = spec
        self.devices = [factory.device]
        self.hidden_dim, self.num_experts, self.num_experts_per_token, self.moe_dim = H, E, spec.top_k, inter
        self.dtype = factory.dtype
        self.apply_router_weight_first = False
        self.activation = spec.activation
        self.swiglu_alpha, self.swiglu_limit = spec.swiglu_alpha, spec.swiglu_limit
        setattr(self, spec.router_name, factory.linear(f"{p}.{spec.router_name}", H, E, spec.router_bias))
        self.experts = Module()
        self.experts.gate_proj = factory.experts(f"{p}.experts.gate_proj", E, H, inter, spec.expert_bias)
        self.experts.up_proj = factory.experts(f"{p}.experts.up_proj", E, H, inter, spec.expert_bias)
        self.experts.down_proj = factory.experts(f"{p}.experts.down_proj", E, inter, H, spec.expert_bias)
        self.has_shared_experts = spec.shared_dim > 0
        if self.has_shared_experts:
            self.shared_experts = GatedMLP(f"{p}.shared_experts", factory, H, spec.shared_dim, cfg.hidden_act,
                                           who=cfg.architecture)

    def route(self, x: TensorValue) -> tuple[TensorValue, TensorValue]:
        s = self.spec
        return moe_route(getattr(self, s.router_name)(x), s.top_k, routing=s.routing, renormalize=s.renormalize,
                         scaling=s.scaling, n_group=s.n_group, topk_group=s.topk_group)

    def expert_weights(self) -> dict[str, Any]:
        e = self.experts
        out = dict(gate=e.gate_proj.weight, up=e.up_proj.weight, down=e.down_proj.weight)
        if self.spec.expert_bias:
            out.update(gate_bias=e.gate_proj.bias, up_bias=e.up_proj.bias, down_bias=e.down_proj.bias)
        return out


def stack_experts(state: dict[str, Any], pattern: str, names: dict[str, str]) -> dict[str, Any]:
    """Replace per-expert tensors by stacked ones.

    ``pattern`` is a regex with groups ``layer``, ``expert``, ``proj`` and ``leaf`` matching module
    names after renaming (e.g. ``layers\\.(?P<layer>\\d+)\\.mlp\\.experts\\.(?P<expert>\\d+)\\.(?P<proj>\\w+)\\.(?P<leaf>weight)``);
    ``names`` maps the checkpoint's projection names to ``gate_proj`` / ``up_proj`` / ``down_proj``
    (Mixtral: ``w1``, ``w3``, ``w2``).  The result holds ``layers.N.mlp.experts.<proj>.<leaf>`` as a
    :class:`Derived` stack over the experts in order.
    """
    rx = re.compile(pattern)
    groups: dict[tuple[str, str, str], dict[int, Any]] = {}
    out: dict[str, Any] = {}
    for name, w in state.items():
        m = rx.fullmatch(name)
        if m is None or m.group("proj") not in names:
            out[name] = w
            continue
        key = (m.group("layer"), names[m.group("proj")], m.group("leaf"))
        groups.setdefault(key, {})[int(m.group("expert"))] = w
    for (layer, proj, leaf), per in groups.items():
        if sorted(per) != list(range(len(per))):
            raise ValueError(f"layer {layer}: experts {sorted(per)} of {proj} are not numbered 0..{len(per) - 1}")
        out[f"layers.{layer}.mlp.experts.{proj}.{leaf}"] = Derived(lambda *ws: torch.stack(ws), *[per[i] for i in
                                                                                                range(len(per))])
    return out
