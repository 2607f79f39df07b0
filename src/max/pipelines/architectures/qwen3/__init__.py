"""Qwen3: the Llama-shaped decoder with per-head RMSNorm of queries and keys."""

from max.pipelines.architectures.qwen3.arch import qwen3_arch

ARCHITECTURES = [qwen3_arch]
