"""The Mamba-2 pipeline model: RMSNorm -> Mamba-2 mixer -> residual per layer, no MLP, no attention."""

from __future__ import annotations

from typing import Any

from max.nn.kv_cache import KVCacheParams, StateSpec
from max.nn.layer import Module
from max.pipelines.architectures.common import DecoderConfig
from max.pipelines.architectures.common.hybrid import (
    HybridLayer,
    HybridPipelineModel,
    Mamba2Mixer,
    build_hybrid,
    mamba2_state_specs,
)
from max.pipelines.architectures.common.layers import rms_norm
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.mamba2.config import config_from_hf
from max.pipelines.architectures.mamba2.weight_adapters import WEIGHT_ADAPTERS


class Mamba2Model(HybridPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS

    @classmethod
    def state_specs(cls, cfg: DecoderConfig) -> list[StateSpec]:
        return mamba2_state_specs(range(cfg.num_hidden_layers), cfg.extra["mamba"])

    @classmethod
    def build_module(cls, cfg: DecoderConfig, factory: WeightFactory, kv_params: KVCacheParams, max_seq_len: int,
                     devices: Any = None) -> Module:
        m = cfg.extra["mamba"]
        layers = [HybridLayer(("norm", "mixer", None, None), rms_norm(cfg, cfg.hidden_size, factory.dtype),
                              Mamba2Mixer(f"layers.{i}.mixer", i, cfg.hidden_size, factory, m))
                  for i in range(cfg.num_hidden_layers)]
        return build_hybrid(cfg, factory, kv_params, layers, 0, cls.state_specs(cfg), embedding_name="embeddings",
                            norm_name="norm_f")
