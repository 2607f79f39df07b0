"""Qwen2 / Qwen2.5: the Llama-shaped decoder with q/k/v projection biases."""

from max.pipelines.architectures.qwen2.arch import qwen2_arch

ARCHITECTURES = [qwen2_arch]
