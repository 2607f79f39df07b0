"""The OlmoForCausalLM pipeline model (see the package docstring)."""

from __future__ import annotations

from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.olmo.config import config_from_hf


class OlmoModel(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
