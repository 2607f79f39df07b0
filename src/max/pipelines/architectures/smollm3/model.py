"""The SmolLM3ForCausalLM pipeline model (see the package docstring).  GGUF: llama.cpp's standard names, q/k
rows permuted for interleaved RoPE as for Llama."""

from __future__ import annotations

from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.smollm3.config import config_from_hf


class SmolLM3Model(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    gguf_interleaved_rope = True
