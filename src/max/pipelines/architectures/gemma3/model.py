"""The Gemma 3 pipeline model: the shared decoder with Gemma 3's config (GGUF q/k rows are in the
rotate-half layout: llama.cpp's Gemma RoPE is ``NEOX``)."""

from __future__ import annotations

from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.gemma3.config import config_from_hf
from max.pipelines.architectures.gemma3.weight_adapters import WEIGHT_ADAPTERS


class Gemma3Model(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
