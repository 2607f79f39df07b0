"""The OlmoForCausalLM pipeline model (see the package docstring).  GGUF: llama.cpp's standard names (no
norm tensors: the LayerNorms have no weights), q/k rows permuted for interleaved RoPE as for Llama."""

from __future__ import annotations

from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.olmo.config import config_from_hf


class OlmoModel(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    gguf_interleaved_rope = True
