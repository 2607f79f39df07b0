"""The Qwen3.5 text pipeline model (the shared Qwen hybrid decoder of ``common.deltanet``, dense MLPs)."""

from __future__ import annotations

from typing import Any

from max.nn.kv_cache import KVCacheParams, StateSpec
from max.nn.layer import Module
from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.deltanet import (
    build_qwen_hybrid,
    qwen_hybrid_attention_layers,
    qwen_hybrid_state_specs,
)
from max.pipelines.architectures.common.hybrid import HybridPipelineModel
from max.pipelines.architectures.common.layers import default_mlp
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.qwen3_5.config import config_from_hf
from max.pipelines.architectures.qwen3_5.weight_adapters import WEIGHT_ADAPTERS


class Qwen3_5Model(HybridPipelineModel):
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
        return build_qwen_hybrid(cfg, factory, kv_params, max_seq_len, fused=False, make_mlp=default_mlp)
