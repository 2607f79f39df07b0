"""Idefics3 (``Idefics3ForConditionalGeneration``; SmolVLM): SigLIP over image tiles, a pixel-shuffle
connector, and a Llama decoder."""

from max.pipelines.architectures.idefics3.arch import idefics3_arch

ARCHITECTURES = [idefics3_arch]
