"""The Llava pipeline model over a Pixtral tower: Mistral 3's pipeline model (image graph, decoder, weight
names) with Llava's configuration."""

from __future__ import annotations

from max.pipelines.architectures.llava.config import config_from_hf, vision_config_from_hf
from max.pipelines.architectures.mistral3.model import Mistral3Model


class LlavaPixtralModel(Mistral3Model):
    config_from_hf = staticmethod(config_from_hf)
    vision_config_from_hf = staticmethod(vision_config_from_hf)
