"""Idefics3's image model: SigLIP (``common.siglip``) over each image tile, then the connector: a pixel
shuffle (each ``scale_factor`` x ``scale_factor`` patches joined into one token) and a linear projection
to the text width.

Graph input: ``pixel_values`` float32 ``[n_tiles, channels, image_size, image_size]`` (the processor's
tiles, padding tiles dropped).  Output: ``[n_tiles, tokens_per_tile, text_hidden]`` (compute dtype).
"""

from __future__ import annotations

from max.graph import DeviceRef, Graph, TensorValue
from max.nn import Module
from max.pipelines.architectures.common.siglip import SiglipVisionTransformer, build_pixels_graph, pixel_shuffle
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.idefics3.config import ARCHITECTURE, VisionConfig

__all__ = ["Idefics3VisionModel", "build_vision_graph"]


class _Projection(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.proj = f.linear("connector.modality_projection.proj", c.hidden_size * c.scale_factor ** 2,
                             c.text_hidden_size)


class Connector(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.c = c
        self.modality_projection = _Projection(c, f)

    def __call__(self, x: TensorValue) -> TensorValue:
        return self.modality_projection.proj(pixel_shuffle(x, self.c.patches_per_side, self.c.scale_factor))


class Idefics3VisionModel(SiglipVisionTransformer):
    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__(c, f)
        self.connector = Connector(c, f)
        f.check_paths(self)

    def __call__(self, pixel_values: TensorValue) -> TensorValue:
        return self.connector(self.encode(pixel_values))


def build_vision_graph(model: Idefics3VisionModel, device: DeviceRef) -> Graph:
    return build_pixels_graph(model, model.config, device, f"{ARCHITECTURE}.vision")
