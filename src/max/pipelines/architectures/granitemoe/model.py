"""The Granite MoE pipeline model: the shared decoder with Granite's multipliers and ``max.nn.MoE`` MLPs."""

from __future__ import annotations

from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.granitemoe.config import config_from_hf
from max.pipelines.architectures.granitemoe.weight_adapters import WEIGHT_ADAPTERS


class GraniteMoeModel(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
    gguf_interleaved_rope = True
