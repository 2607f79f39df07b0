"""The InternVL pipeline model: the shared decoder (Qwen2 / Llama / Qwen3) with the tiles' embeddings
(``vision.py``) at the image placeholder rows (``common.multimodal``); causal attention throughout.

Each image's pixel array is its tiles plus thumbnail ``[tiles, C, H, W]`` (``processor.py``); the tiles of
every context of a step go through the image graph in one call, and each image's rows follow its
placeholder span (``tiles * tokens_per_tile`` tokens)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from max.pipelines.architectures.common.multimodal import VisionDecoderPipelineModel
from max.pipelines.architectures.internvl.config import config_from_hf, vision_config_from_hf
from max.pipelines.architectures.internvl.vision import InternVLVisionModel, build_vision_graph
from max.pipelines.architectures.internvl.weight_adapters import WEIGHT_ADAPTERS, vision_weights


class InternVLModel(VisionDecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
    vision_config_from_hf = staticmethod(vision_config_from_hf)
    vision_module = InternVLVisionModel
    vision_graph = staticmethod(build_vision_graph)
    vision_adapter = staticmethod(vision_weights)

    def encode(self, contexts: Sequence[Any]) -> list[torch.Tensor]:
        v = self.vision_config
        want = (v.num_channels, v.image_size, v.image_size)
        images = [np.asarray(p, np.float32) for c in contexts for p in c.pixel_values]
        for p in images:
            if p.ndim != 4 or p.shape[1:] != want:
                raise ValueError(f"{self.config.architecture}: each image must be processed to tiles "
                                 f"[n, {', '.join(map(str, want))}], got {list(p.shape)}")
        (out,) = self.vision_model.execute(self.to_device(np.concatenate(images)))
        emb = out._torch()  # [all tiles, tokens_per_tile, hidden]
        per_context = [sum(len(p) for p in c.pixel_values) for c in contexts]
        return [e.reshape(-1, emb.shape[-1]) for e in torch.split(emb, per_context)]
