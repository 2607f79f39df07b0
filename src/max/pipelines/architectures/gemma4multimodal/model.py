"""The Gemma 4 multimodal pipeline model, run for text: the gemma4 family's decoder with this family's
config translation and weight adapter."""

from __future__ import annotations

from max.pipelines.architectures.gemma4.model import Gemma4Model
from max.pipelines.architectures.gemma4multimodal.config import config_from_hf
from max.pipelines.architectures.gemma4multimodal.weight_adapters import WEIGHT_ADAPTERS


class Gemma4TextOnlyModel(Gemma4Model):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
