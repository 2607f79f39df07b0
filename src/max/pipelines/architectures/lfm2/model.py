"""The LFM2 pipeline model: per layer ``operator_norm`` -> (gated short conv | attention) -> residual,
``ffn_norm`` -> SwiGLU ``feed_forward`` -> residual; final ``embedding_norm``."""

from __future__ import annotations

from typing import Any

from max.graph import TensorValue, ops
from max.nn.kv_cache import KVCacheParams, StateSpec
from max.nn.layer import Module
from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.hybrid import (
    AttentionMixer,
    HybridCollection,
    HybridLayer,
    HybridPipelineModel,
    Params,
    build_hybrid,
)
from max.pipelines.architectures.common.layers import DecoderAttention, GatedMLP, make_rope, rms_norm
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.lfm2.config import config_from_hf
from max.pipelines.architectures.lfm2.weight_adapters import WEIGHT_ADAPTERS


class ShortConv(Module):
    """LFM2's gated short convolution: ``B, C, x = in_proj(h)``; ``out_proj(C * conv(B * x))`` (depthwise
    causal conv of ``conv_L_cache`` taps, its window kept in the request's state slot)."""

    def __init__(self, prefix: str, layer: int, hidden: int, kernel: int, bias: bool, factory: WeightFactory) -> None:
        super().__init__()
        self.layer, self.hidden, self.kernel, self.has_bias = layer, hidden, kernel, bias
        self.in_proj = factory.linear(f"{prefix}.in_proj", hidden, 3 * hidden, bias)
        conv = {"weight": (factory.dtype, [hidden, 1, kernel])}
        if bias:
            conv["bias"] = (factory.dtype, [hidden])
        self.conv = Params(factory.device, **conv)
        self.out_proj = factory.linear(f"{prefix}.out_proj", hidden, hidden, bias)

    def __call__(self, x: TensorValue, coll: HybridCollection, offsets: TensorValue) -> TensorValue:
        H = self.hidden
        bcx = self.in_proj(x)
        bx = bcx[:, :H] * bcx[:, 2 * H:]
        w = ops.reshape(self.conv.weight, [H, self.kernel])
        h = ops.causal_conv1d(bx, w, coll.states[f"layers.{self.layer}.conv"], coll.slots, offsets,
                              bias=self.conv.bias if self.has_bias else None)
        return self.out_proj(bcx[:, H:2 * H] * h)


class Lfm2Model(HybridPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS

    @classmethod
    def attention_layers(cls, cfg: DecoderConfig) -> list[int]:
        return [i for i, t in enumerate(cfg.extra["layer_types"]) if t == "full_attention"]

    @classmethod
    def state_specs(cls, cfg: DecoderConfig) -> list[StateSpec]:
        k = cfg.extra["conv_kernel"]
        return [StateSpec(f"layers.{i}.conv", (cfg.hidden_size, k - 1))
                for i, t in enumerate(cfg.extra["layer_types"]) if t == "conv"]

    @classmethod
    def build_module(cls, cfg: DecoderConfig, factory: WeightFactory, kv_params: KVCacheParams, max_seq_len: int,
                     devices: Any = None) -> Module:
        attn = cls.attention_layers(cfg)
        rope = make_rope(cfg, max_seq_len, factory.device) if attn else None
        layers = []
        for i, t in enumerate(cfg.extra["layer_types"]):
            if t == "conv":
                mixer: Module = ShortConv(f"layers.{i}.conv", i, cfg.hidden_size, cfg.extra["conv_kernel"],
                                          cfg.extra["conv_bias"], factory)
                names = ("operator_norm", "conv", "ffn_norm", "feed_forward")
            else:
                mixer = AttentionMixer(DecoderAttention(cfg, i, factory, kv_params, rope), attn.index(i))
                names = ("operator_norm", "self_attn", "ffn_norm", "feed_forward")
            mlp = GatedMLP(f"layers.{i}.feed_forward", factory, cfg.hidden_size, cfg.intermediate_size,
                           cfg.hidden_act, who=cfg.architecture)
            layers.append(HybridLayer(names, rms_norm(cfg, cfg.hidden_size, factory.dtype), mixer,
                                      rms_norm(cfg, cfg.hidden_size, factory.dtype), mlp))
        return build_hybrid(cfg, factory, kv_params, layers, len(attn), cls.state_specs(cfg),
                            norm_name="embedding_norm")
