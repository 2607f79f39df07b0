"""The Idefics3 pipeline model: the shared decoder (Llama) with the tiles' embeddings (``vision.py``) at
the image placeholder rows (``common.multimodal``); causal attention throughout."""

from __future__ import annotations

from max.pipelines.architectures.common.multimodal import VisionDecoderPipelineModel
from max.pipelines.architectures.idefics3.config import config_from_hf, vision_config_from_hf
from max.pipelines.architectures.idefics3.vision import Idefics3VisionModel, build_vision_graph
from max.pipelines.architectures.idefics3.weight_adapters import WEIGHT_ADAPTERS, vision_weights


class Idefics3Model(VisionDecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
    vision_config_from_hf = staticmethod(vision_config_from_hf)
    vision_module = Idefics3VisionModel
    vision_graph = staticmethod(build_vision_graph)
    vision_adapter = staticmethod(vision_weights)
