"""The Qwen2 pipeline model: the shared decoder with q/k/v biases (GGUF q/k rows are not permuted:
llama.cpp's Qwen2 RoPE is the rotate-half ``NEOX`` layout)."""

from __future__ import annotations

from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.qwen2.config import config_from_hf


class Qwen2Model(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
