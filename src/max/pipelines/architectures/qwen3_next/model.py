"""The Qwen3-Next pipeline model (the shared Qwen hybrid decoder of ``common.deltanet``; MoE layers with a
gated shared expert, dense layers where ``mlp_only_layers`` / ``decoder_sparse_step`` say so)."""

from __future__ import annotations

from max.nn.layer import Module
from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.deltanet import QwenHybridModel, SharedGateMoE
from max.pipelines.architectures.common.layers import GatedMLP
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.qwen3_next.config import config_from_hf
from max.pipelines.architectures.qwen3_next.weight_adapters import WEIGHT_ADAPTERS


def _mlp(cfg: DecoderConfig, layer: int, factory: WeightFactory) -> Module:
    if cfg.moe is not None and layer not in cfg.moe.dense_layers:
        return SharedGateMoE(cfg, layer, factory, cfg.extra["shared_expert_dim"])
    return GatedMLP(f"layers.{layer}.mlp", factory, cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                    who=cfg.architecture)


class Qwen3NextModel(QwenHybridModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
    fused = True
    make_mlp = staticmethod(_mlp)
