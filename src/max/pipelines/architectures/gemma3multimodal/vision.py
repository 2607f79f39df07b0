"""Gemma 3's image model: the SigLIP vision tower (``common.siglip``) and the multimodal projector, and the
image graph.

Graph input: ``pixel_values`` float32 ``[n_images, channels, image_size, image_size]`` (the processor's
output).  Output: ``[n_images, mm_tokens_per_image, text_hidden]`` image embeddings in the compute dtype,
the rows that replace the image placeholder tokens of the text sequence.

Projector: average pool of the patch grid to ``tokens_per_side``\\ :sup:`2` tokens, Gemma RMSNorm
(``1 + weight``), ``x @ mm_input_projection_weight``.
"""

from __future__ import annotations

from max.graph import DeviceRef, Graph, TensorValue, Weight, ops
from max.nn import Module
from max.nn.norm import RMSNorm
from max.pipelines.architectures.common.siglip import SiglipVisionTransformer, build_pixels_graph
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.gemma3multimodal.config import ARCHITECTURE, VisionConfig

__all__ = ["Gemma3VisionModel", "build_vision_graph"]


class MultiModalProjector(Module):
    """Average pool of the ``patches_per_side``\\ :sup:`2` grid to ``tokens_per_side``\\ :sup:`2` tokens,
    RMSNorm (``1 + weight``, float32), projection to the text width."""

    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.c = c
        self.mm_soft_emb_norm = RMSNorm(c.hidden_size, f.dtype, c.layer_norm_eps, weight_offset=1.0,
                                        multiply_before_cast=True)
        self.mm_input_projection_weight = Weight("mm_input_projection_weight", f.dtype,
                                                 [c.hidden_size, c.text_hidden_size], f.device)

    def __call__(self, x: TensorValue) -> TensorValue:
        c = self.c
        n, t = x.shape[0], c.tokens_per_side
        k = c.patches_per_side // t
        x = ops.reshape(x, [n, t, k, t, k, c.hidden_size])  # patch (row, col) = (tr * k + kr, tc * k + kc)
        x = ops.reshape(ops.permute(x, [0, 1, 3, 5, 2, 4]), [n, t * t, c.hidden_size, k * k])
        pooled = ops.reshape(ops.mean(x, axis=-1), [n, t * t, c.hidden_size])
        return self.mm_soft_emb_norm(pooled) @ self.mm_input_projection_weight


class Gemma3VisionModel(SiglipVisionTransformer):
    """pixels -> SigLIP -> projector: ``[n_images, mm_tokens_per_image, text_hidden]``.  Module names are the
    checkpoint's after the family's weight adapter (``embeddings.*``, ``encoder.layers.*``, ``post_layernorm``,
    ``multi_modal_projector.*``)."""

    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__(c, f)
        self.multi_modal_projector = MultiModalProjector(c, f)
        f.check_paths(self)

    def __call__(self, pixel_values: TensorValue) -> TensorValue:
        return self.multi_modal_projector(self.encode(pixel_values))


def build_vision_graph(model: Gemma3VisionModel, device: DeviceRef) -> Graph:
    return build_pixels_graph(model, model.config, device, f"{ARCHITECTURE}.vision")
