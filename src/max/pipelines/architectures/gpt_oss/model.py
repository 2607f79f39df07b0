"""The GPT-OSS pipeline model: the shared decoder with sinks (``nn.kernels_decoder.ragged_attention``) and
``max.nn.MoE`` MLPs."""

from __future__ import annotations

from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.gpt_oss.config import config_from_hf
from max.pipelines.architectures.gpt_oss.weight_adapters import WEIGHT_ADAPTERS


class GptOssModel(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
