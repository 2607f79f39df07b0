"""The Qwen3-VL pipeline model: Qwen2.5-VL's M-RoPE decoder (``qwen2_5vl.model``) with Qwen3's per-head q/k
norms and *interleaved* M-RoPE frequencies, the Qwen3-VL vision tower, and DeepStack.

DeepStack: the image graph returns, per image token, the final merger's embedding and the features of the
``D`` DeepStack mergers side by side (``[n, hidden * (1 + D)]``); the step graph writes the first
``hidden`` columns at the image rows of the token embeddings and adds feature ``k`` to the output of decoder
layer ``k`` (``k < D``) at the same rows -- the rows of this step's image tokens, so a prompt split over
prefill chunks gets each row's features in the chunk that holds it.

Video frames are image runs of their own (one temporal patch each, grid ``(1, h, w)``): per-frame attention
in the vision tower and per-frame M-RoPE positions make a video of ``t`` temporal patches the same as ``t``
images separated by their timestamps (see ``processor``).
"""

from __future__ import annotations

import numpy as np

from max.graph import TensorValue, ops
from max.nn.layer import Module
from max.pipelines.architectures.qwen2_5vl.model import Qwen2_5VLModel
from max.pipelines.architectures.qwen3vl.config import (
    config_from_hf,
    interleaved_axes,
    vision_config_from_hf,
)
from max.pipelines.architectures.qwen3vl.vision import Qwen3VisionModel, build_vision_graph, vision_layout
from max.pipelines.architectures.qwen3vl.weight_adapters import WEIGHT_ADAPTERS, vision_weights


class Qwen3VLModel(Qwen2_5VLModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
    vision_config_from_hf = staticmethod(vision_config_from_hf)
    vision_module = Qwen3VisionModel
    vision_graph = staticmethod(build_vision_graph)
    vision_adapter = staticmethod(vision_weights)

    @staticmethod
    def mrope_axes(section: list[int], half: int) -> np.ndarray:
        return interleaved_axes(section, half)

    @property
    def n_deepstack(self) -> int:
        """Decoder layers that get a DeepStack feature (transformers ignores features beyond the last layer)."""
        return min(self.config.extra["deepstack"], self.config.num_hidden_layers)

    @property
    def image_embedding_width(self) -> int:
        return self.config.hidden_size * (1 + self.config.extra["deepstack"])

    def merge_image_embeddings(self, module: Module, h: TensorValue, img: TensorValue,
                               rows: TensorValue) -> TensorValue:
        hidden = self.config.hidden_size
        for k in range(self.n_deepstack):
            feature = img[:, (k + 1) * hidden:(k + 2) * hidden]
            object.__setattr__(module.layers[k], "post_layer",
                               lambda x, f=feature: ops.scatter_nd_add(x, ops.cast(f, x.dtype), rows))
        return ops.scatter_nd(h, img[:, :hidden], rows)

    def bind_step_inputs(self, module: Module, values: list[TensorValue] | None) -> None:
        super().bind_step_inputs(module, values)
        if values is None:
            for layer in module.layers:
                object.__setattr__(layer, "post_layer", None)

    def vision_inputs(self, patches: np.ndarray, grids: np.ndarray) -> tuple[np.ndarray, ...]:
        c = self.vision_config
        lay = vision_layout(c, grids)
        return (np.ascontiguousarray(patches.reshape(-1, c.merge_unit * c.patch_dim)), lay.pos_index, lay.pos_weight,
                lay.cos, lay.sin, lay.mask)
