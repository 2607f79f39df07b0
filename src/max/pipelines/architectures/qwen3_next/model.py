"""The Qwen3-Next pipeline model (the shared Qwen hybrid decoder of ``common.deltanet``; MoE layers with a
gated shared expert, dense layers where ``mlp_only_layers`` / ``decoder_sparse_step`` say so)."""

from __future__ import annotations

from typing import Any

from max.nn.kv_cache import KVCacheParams, StateSpec
from max.nn.layer import Module
from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.deltanet import (
    SharedGateMoE,
    build_qwen_hybrid,
    qwen_hybrid_attention_layers,
    qwen_hybrid_state_specs,
)
from max.pipelines.architectures.common.hybrid import HybridPipelineModel
from max.pipelines.architectures.common.layers import GatedMLP
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.qwen3_next.config import config_from_hf
from max.pipelines.architectures.qwen3_next.weight_adapters import WEIGHT_ADAPTERS


def _mlp(cfg: DecoderConfig, layer: int, factory: WeightFactory) -> Module:
    if cfg.moe is not None and layer not in cfg.moe.dense_layers:
        return SharedGateMoE(cfg, layer, factory, cfg.extra["shared_expert_dim"])
    return GatedMLP(f"layers.{layer}.mlp", factory, cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                    who=cfg.architecture)


class Qwen3NextModel(HybridPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS

    @classmethod
    def attention_layers(cls, cfg: DecoderConfig) -> list[int]:
        return qwen_hybrid_attention_layers(cfg)

    @classmethod
    def state_specs(cls, cfg: DecoderConfig) -> list[StateSpec]:
        return qwen_hybrid_state_specs(cfg)

    @classmethod
    def build_module(cls, cfg: DecoderConfig, factory: WeightFactory, kv_params: KVCacheParams, max_seq_len: int,
                     devices: Any = None) -> Module:
        return build_qwen_hybrid(cfg, factory, kv_params, max_seq_len, fused=True, make_mlp=_mlp)
