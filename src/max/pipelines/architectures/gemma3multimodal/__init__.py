"""Gemma 3 multimodal (``Gemma3ForConditionalGeneration``: 4B/12B/27B): SigLIP vision tower + projector
feeding Gemma 3's text decoder."""

from max.pipelines.architectures.gemma3multimodal.arch import gemma3multimodal_arch

ARCHITECTURES = [gemma3multimodal_arch]
