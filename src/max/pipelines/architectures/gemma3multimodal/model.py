"""The Gemma 3 multimodal pipeline model: Gemma 3's text decoder (the shared decoder) with the image
embeddings of the SigLIP tower + projector (``vision.py``) at the image placeholder rows
(``common.multimodal``).

Its own step input: ``attention_blocks`` int64 ``[total_seq_len]`` (the image's index per image token,
-1 for text): an image's tokens attend to each other both ways, as transformers does with the
processor's ``token_type_ids`` (the pipeline never cuts an image with a prefill chunk).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from max.dtype import DType
from max.graph import DeviceRef, TensorType, TensorValue
from max.nn.layer import Module
from max.pipelines.architectures.common.multimodal import VisionDecoderPipelineModel
from max.pipelines.architectures.gemma3multimodal.config import config_from_hf, vision_config_from_hf
from max.pipelines.architectures.gemma3multimodal.vision import Gemma3VisionModel, build_vision_graph
from max.pipelines.architectures.gemma3multimodal.weight_adapters import WEIGHT_ADAPTERS, vision_weights


class Gemma3MultimodalModel(VisionDecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
    vision_config_from_hf = staticmethod(vision_config_from_hf)
    vision_module = Gemma3VisionModel
    vision_graph = staticmethod(build_vision_graph)
    vision_adapter = staticmethod(vision_weights)

    def step_input_types(self, device: DeviceRef) -> list[TensorType]:
        return [TensorType(DType.int64, ["total_seq_len"], device)]

    def bind_step_inputs(self, module: Module, values: list[TensorValue] | None) -> None:
        for layer in module.layers:
            layer.self_attn.block_groups = values[0] if values else None

    def step_arrays(self, context_batch: Sequence[Any]) -> list[np.ndarray]:
        blocks = []
        for c in context_batch:
            blk = np.full(c.active_idx - c.start_idx, -1, np.int64)
            for k, im in enumerate(getattr(c, "images", ())):
                lo, hi = max(im.start_idx, c.start_idx), min(im.end_idx, c.active_idx)
                if lo < hi:
                    blk[lo - c.start_idx:hi - c.start_idx] = k  # block ids only meet within one request
            blocks.append(blk)
        return [np.concatenate(blocks) if blocks else np.zeros(0, np.int64)]
