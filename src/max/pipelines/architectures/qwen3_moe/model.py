"""The Qwen3-MoE pipeline model: the shared decoder with q/k norms and ``max.nn.MoE`` MLPs (dense MLPs on
``mlp_only_layers``); GGUF RoPE is rotate-half."""

from __future__ import annotations

from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.qwen3_moe.config import config_from_hf
from max.pipelines.architectures.qwen3_moe.weight_adapters import WEIGHT_ADAPTERS


class Qwen3MoeModel(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
