"""The Mixtral pipeline model: the shared decoder with ``max.nn.MoE`` MLPs."""

from __future__ import annotations

from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.mixtral.config import config_from_hf
from max.pipelines.architectures.mixtral.weight_adapters import WEIGHT_ADAPTERS


class MixtralModel(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
    gguf_interleaved_rope = True
