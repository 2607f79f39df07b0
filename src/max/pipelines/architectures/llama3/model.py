"""The Llama pipeline model: the shared decoder with Llama's config and adapters."""

from __future__ import annotations

from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.llama3.config import config_from_hf
from max.pipelines.architectures.llama3.weight_adapters import GGUF_INTERLEAVED_ROPE, WEIGHT_ADAPTERS


class Llama3Model(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
    gguf_interleaved_rope = GGUF_INTERLEAVED_ROPE
