"""Mistral: the Llama-shaped decoder with a sliding attention window."""

from max.pipelines.architectures.mistral.arch import mistral_arch

ARCHITECTURES = [mistral_arch]
