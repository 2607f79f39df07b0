"""Llama 4 with images (``Llama4ForConditionalGeneration``): the Llama 4 vision encoder (unfolded patches,
2-D RoPE, pixel-shuffle MLP) and projector in front of the Llama 4 text decoder (``architectures/llama4``)."""

from max.pipelines.architectures.llama4vision.arch import llama4vision_arch

ARCHITECTURES = [llama4vision_arch]
