"""Qwen3: the Llama decoder with per-head RMSNorm of queries and keys."""

from max.pipelines.architectures.llama3.arch import make

qwen3_arch = make("Qwen3ForCausalLM", "Qwen/Qwen3-0.6B", ["qwen3"])
