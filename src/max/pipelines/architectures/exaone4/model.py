"""The Exaone4ForCausalLM pipeline model (see the package docstring)."""

from __future__ import annotations

from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.exaone4.config import config_from_hf
from max.pipelines.architectures.exaone4.weight_adapters import WEIGHT_ADAPTERS


class Exaone4Model(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
