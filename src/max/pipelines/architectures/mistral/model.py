"""The Mistral pipeline model: the shared decoder; every layer uses ``sliding_window`` when it is set.

GGUF q/k rows are permuted for interleaved RoPE as for Llama; names are llama.cpp's standard ones.
"""

from __future__ import annotations

from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.mistral.config import config_from_hf


class MistralModel(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    gguf_interleaved_rope = True
