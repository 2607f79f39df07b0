"""The Granite 4 hybrid pipeline model: per layer ``input_layernorm`` -> (Mamba-2 ``mamba`` | attention
``self_attn``) -> scaled residual, ``post_attention_layernorm`` -> experts + ``shared_mlp`` -> scaled residual;
embedding and logit multipliers."""

from __future__ import annotations

from typing import Any

from max.nn.kv_cache import KVCacheParams, StateSpec
from max.nn.layer import Module
from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.hybrid import (
    AttentionMixer,
    HybridLayer,
    HybridPipelineModel,
    Mamba2Mixer,
    build_hybrid,
    mamba2_state_specs,
)
from max.pipelines.architectures.common.layers import DecoderAttention, GatedMLP, make_rope, rms_norm
from max.pipelines.architectures.common.moe import DecoderMoE
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.granitemoehybrid.config import config_from_hf
from max.pipelines.architectures.granitemoehybrid.weight_adapters import WEIGHT_ADAPTERS


class GraniteMoeHybridModel(HybridPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
    gguf_interleaved_rope = True

    @classmethod
    def attention_layers(cls, cfg: DecoderConfig) -> list[int]:
        return [i for i, t in enumerate(cfg.extra["layer_types"]) if t == "attention"]

    @classmethod
    def state_specs(cls, cfg: DecoderConfig) -> list[StateSpec]:
        return mamba2_state_specs([i for i, t in enumerate(cfg.extra["layer_types"]) if t == "mamba"],
                                  cfg.extra["mamba"])

    @classmethod
    def build_module(cls, cfg: DecoderConfig, factory: WeightFactory, kv_params: KVCacheParams, max_seq_len: int,
                     devices: Any = None) -> Module:
        attn = cls.attention_layers(cfg)
        rope = make_rope(cfg, max_seq_len, factory.device) if attn and cfg.extra["rope"] else None
        layers = []
        for i, t in enumerate(cfg.extra["layer_types"]):
            if t == "mamba":
                mixer: Module = Mamba2Mixer(f"layers.{i}.mamba", i, cfg.hidden_size, factory, cfg.extra["mamba"])
                name = "mamba"
            else:
                mixer = AttentionMixer(DecoderAttention(cfg, i, factory, kv_params, rope), attn.index(i))
                name = "self_attn"
            shared = GatedMLP(f"layers.{i}.shared_mlp", factory, cfg.hidden_size, cfg.extra["shared_dim"],
                              cfg.hidden_act, fused=True, who=cfg.architecture)
            mlps: tuple = (DecoderMoE(cfg, i, factory), shared) if cfg.moe is not None else (shared,)
            names = ("input_layernorm", name, "post_attention_layernorm",
                     ("mlp", "shared_mlp") if cfg.moe is not None else ("shared_mlp",))
            layers.append(HybridLayer(names, rms_norm(cfg, cfg.hidden_size, factory.dtype), mixer,
                                      rms_norm(cfg, cfg.hidden_size, factory.dtype), mlps,
                                      residual=cfg.residual_multiplier))
        return build_hybrid(cfg, factory, kv_params, layers, len(attn), cls.state_specs(cfg))
