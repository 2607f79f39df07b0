"""Qwen3: the Llama-shaped decoder with per-head RMSNorm of queries and keys; Qwen3-Embedding."""

from max.pipelines.architectures.qwen3.arch import qwen3_arch, qwen3_embedding_arch

ARCHITECTURES = [qwen3_arch, qwen3_embedding_arch]
