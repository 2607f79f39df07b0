"""The OLMo 2 pipeline model: the shared decoder with post-norms and full q/k norms (GGUF RoPE is
rotate-half)."""

from __future__ import annotations

from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.olmo2.config import config_from_hf
from max.pipelines.architectures.olmo2.weight_adapters import WEIGHT_ADAPTERS


class Olmo2Model(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
