"""The Mistral 3 pipeline model: the shared decoder (Mistral: RoPE, a sliding window when the text config
sets one) with the Pixtral image embeddings (``vision.py``) at the ``[IMG]`` rows (``common.multimodal``);
the break and end tokens inside an image keep their text embeddings.  All of a step's images, of any
sizes, go through one image-graph call."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from max.pipelines.architectures.common.multimodal import VisionDecoderPipelineModel
from max.pipelines.architectures.mistral3.config import config_from_hf, vision_config_from_hf
from max.pipelines.architectures.mistral3.vision import Mistral3VisionModel, build_vision_graph, image_layout
from max.pipelines.architectures.mistral3.weight_adapters import WEIGHT_ADAPTERS, vision_weights


class Mistral3Model(VisionDecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
    vision_config_from_hf = staticmethod(vision_config_from_hf)
    vision_module = Mistral3VisionModel
    vision_graph = staticmethod(build_vision_graph)
    vision_adapter = staticmethod(vision_weights)

    def encode(self, contexts: Sequence[Any]) -> list[torch.Tensor]:
        lay = image_layout(self.vision_config, [p for c in contexts for p in c.pixel_values])
        (out,) = self.vision_model.execute(*(self.to_device(a) for a in (lay.patches, lay.cos, lay.sin, lay.offsets)))
        per_image = iter(lay.tokens)
        return list(torch.split(out._torch(), [sum(next(per_image) for _ in c.pixel_values) for c in contexts]))
