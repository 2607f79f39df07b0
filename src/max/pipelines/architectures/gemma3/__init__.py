"""Gemma 3 text models (``Gemma3ForCausalLM``: 270M/1B, and the text part of the larger ones)."""

from max.pipelines.architectures.gemma3.arch import gemma3_arch

ARCHITECTURES = [gemma3_arch]
