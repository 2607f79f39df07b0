"""The Phi-3 pipeline model: the shared decoder with fused projections (GGUF RoPE is rotate-half)."""

from __future__ import annotations

from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.phi3.config import config_from_hf
from max.pipelines.architectures.phi3.weight_adapters import WEIGHT_ADAPTERS


class Phi3Model(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
