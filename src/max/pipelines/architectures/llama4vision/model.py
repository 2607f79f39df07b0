"""The Llama 4 vision-language pipeline model: Llama 4's text decoder (``architectures/llama4``: its layers and
its ``max_length`` cap) with the tiles' embeddings (``vision.py``) at the ``<|patch|>`` placeholder rows
(``common.multimodal``).  Each tile (and each image's global view) has its own placeholder span."""

from __future__ import annotations

from max.pipelines.architectures.common.multimodal import VisionDecoderPipelineModel
from max.pipelines.architectures.llama4.model import Llama4Model
from max.pipelines.architectures.llama4vision.config import config_from_hf, vision_config_from_hf
from max.pipelines.architectures.llama4vision.vision import Llama4VisionEncoder, build_vision_graph
from max.pipelines.architectures.llama4vision.weight_adapters import WEIGHT_ADAPTERS, vision_weights


class Llama4VisionLanguageModel(VisionDecoderPipelineModel, Llama4Model):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
    vision_config_from_hf = staticmethod(vision_config_from_hf)
    vision_module = Llama4VisionEncoder
    vision_graph = staticmethod(build_vision_graph)
    vision_adapter = staticmethod(vision_weights)
