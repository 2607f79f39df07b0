"""Gemma 4's mixture-of-experts block (26B-A4B): routed experts beside each layer's dense MLP.

The router reads the layer's residual stream ``h`` (after attention): a weightless RMSNorm of ``h``
times a learned ``scale`` and ``1 / sqrt(hidden)``, projected to expert scores; softmax, the top
``top_k_experts``, renormalised to sum 1, each multiplied by its expert's ``per_expert_scale``.  The
experts (gated MLPs of ``moe_intermediate_size``, the config's activation) read
``pre_feedforward_layernorm_2(h)``; the layer adds ``post_feedforward_layernorm_2`` of their output to
``post_feedforward_layernorm_1`` of the dense MLP's, before the layer's ``post_feedforward_layernorm``.

Checkpoint layout: ``layers.N.router.{proj.weight, scale, per_expert_scale}``,
``layers.N.experts.gate_up_proj`` ``[experts, 2 * moe_dim, hidden]`` (gate rows, then up rows) and
``layers.N.experts.down_proj`` ``[experts, hidden, moe_dim]``; :func:`split_experts` gives the stacked
``gate_proj`` / ``up_proj`` / ``down_proj`` weights :func:`max.nn.moe.moe_experts_ffn` takes.
"""

from __future__ import annotations

import re
from typing import Any

from max.dtype import DType
from max.graph import TensorValue, Weight, ops
from max.nn.layer import Module
from max.nn.moe import moe_experts_ffn, moe_route
from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.weights import Derived, WeightFactory

__all__ = ["Gemma4Experts", "split_experts"]

_EXPERT_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
                       "gelu": "gelu", "silu": "silu", "swish": "silu"}


class _Router(Module):
    def __init__(self, cfg: DecoderConfig, layer: int, factory: WeightFactory) -> None:
        super().__init__()
        H, E = cfg.hidden_size, int(cfg.extra["num_experts"])
        self.proj = factory.linear(f"layers.{layer}.router.proj", H, E, False)
        self.scale = Weight("scale", factory.dtype, [H], factory.device)
        self.per_expert_scale = Weight("per_expert_scale", factory.dtype, [E], factory.device)


class Gemma4Experts(Module):
    """The routed half of a Gemma 4 MoE layer: ``__call__(h, x)`` with ``h`` the residual stream (what
    the router reads) and ``x`` the experts' input (``pre_feedforward_layernorm_2(h)``)."""

    def __init__(self, cfg: DecoderConfig, layer: int, factory: WeightFactory) -> None:
        super().__init__()
        e = cfg.extra
        H, E, inter = cfg.hidden_size, int(e["num_experts"]), int(e["moe_dim"])
        self.k, self.hidden, self.eps = int(e["top_k"]), H, cfg.rms_norm_eps
        if cfg.hidden_act not in _EXPERT_ACTIVATIONS:
            raise NotImplementedError(f"{cfg.architecture}: expert activation {cfg.hidden_act!r} is not supported "
                                      f"(supported: {sorted(_EXPERT_ACTIVATIONS)})")
        self.act = _EXPERT_ACTIVATIONS[cfg.hidden_act]
        self.router = _Router(cfg, layer, factory)
        p = f"layers.{layer}.experts"
        self.experts = Module()
        self.experts.gate_proj = factory.experts(f"{p}.gate_proj", E, H, inter)
        self.experts.up_proj = factory.experts(f"{p}.up_proj", E, H, inter)
        self.experts.down_proj = factory.experts(f"{p}.down_proj", E, inter, H)

    def route(self, h: TensorValue) -> tuple[TensorValue, TensorValue]:
        """Each token's ``k`` experts and their weights (float32) from the residual stream ``h``."""
        r = self.router
        hf = h.cast(DType.float32)
        normed = (hf * ops.rsqrt(ops.mean(hf * hf, axis=-1) + self.eps)).cast(h.dtype)
        scores = r.proj(normed * r.scale * (float(self.hidden) ** -0.5))
        ids, weights = moe_route(scores, self.k, routing="softmax_topk", renormalize=True)
        per_expert = ops.gather(r.per_expert_scale.cast(DType.float32), ops.reshape(ids, [-1]), axis=0)
        return ids, weights * ops.reshape(per_expert, ids.shape)

    def __call__(self, h: TensorValue, x: TensorValue) -> TensorValue:
        ids, weights = self.route(h)
        e = self.experts
        return moe_experts_ffn(x, ids, weights, e.gate_proj.weight, e.up_proj.weight, e.down_proj.weight,
                               activation=self.act)


_FUSED = re.compile(r"(layers\.\d+\.experts)\.(gate_up_proj|down_proj)")


def split_experts(state: dict[str, Any]) -> dict[str, Any]:
    """``layers.N.experts.gate_up_proj`` -> ``...gate_proj.weight`` and ``...up_proj.weight`` (the first and
    second half of each expert's rows), ``layers.N.experts.down_proj`` -> ``...down_proj.weight``."""
    out: dict[str, Any] = {}
    for name, w in state.items():
        m = _FUSED.fullmatch(name)
        if m is None:
            out[name] = w
        elif m.group(2) == "down_proj":
            out[f"{m.group(1)}.down_proj.weight"] = w
        else:
            out[f"{m.group(1)}.gate_proj.weight"] = Derived(lambda t: t[:, : t.shape[1] // 2].contiguous(), w)
            out[f"{m.group(1)}.up_proj.weight"] = Derived(lambda t: t[:, t.shape[1] // 2:].contiguous(), w)
    return out
