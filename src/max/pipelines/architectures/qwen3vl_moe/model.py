"""The Qwen3-VL-MoE pipeline model: Qwen3-VL (``qwen3vl.model``) with the shared decoder's mixture-of-experts
MLPs (``common.moe``)."""

from __future__ import annotations

from max.pipelines.architectures.qwen3vl.model import Qwen3VLModel
from max.pipelines.architectures.qwen3vl_moe.config import config_from_hf
from max.pipelines.architectures.qwen3vl_moe.weight_adapters import WEIGHT_ADAPTERS, vision_weights


class Qwen3VLMoeModel(Qwen3VLModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
    vision_adapter = staticmethod(vision_weights)
