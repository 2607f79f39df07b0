"""The Qwen3 pipeline model: the shared decoder with q/k norms (rotate-half RoPE in GGUF too)."""

from __future__ import annotations

from max.pipelines.architectures.common.embeddings import DecoderEmbeddingModel
from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.qwen3.config import config_from_hf


class Qwen3Model(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)


class Qwen3EmbeddingModel(DecoderEmbeddingModel):
    config_from_hf = staticmethod(config_from_hf)
