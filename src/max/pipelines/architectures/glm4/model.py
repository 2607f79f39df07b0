"""The Glm4ForCausalLM pipeline model (see the package docstring)."""

from __future__ import annotations

from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.glm4.config import config_from_hf


class Glm4Model(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
