"""Mistral 3 (``Mistral3ForConditionalGeneration``; Mistral Small 3.x): a Pixtral vision encoder (2-D RoPE,
images of any size attended block-diagonally), a patch merger and projector, and a Mistral decoder."""

from max.pipelines.architectures.mistral3.arch import mistral3_arch

ARCHITECTURES = [mistral3_arch]
