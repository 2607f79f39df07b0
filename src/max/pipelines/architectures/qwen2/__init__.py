"""Qwen2 / Qwen2.5: the Llama decoder with q/k/v projection biases (non-interleaved RoPE in GGUF too)."""

from max.pipelines.architectures.llama3.arch import make

qwen2_arch = make("Qwen2ForCausalLM", "Qwen/Qwen2.5-0.5B-Instruct", ["qwen2"])
