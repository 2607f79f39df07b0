"""Qwen3-Next (``Qwen3NextForCausalLM``): gated DeltaNet layers (q, k, v, z and b, a interleaved per key
head) between gated-output attention layers, mixture-of-experts MLPs with a sigmoid-gated shared expert."""

from max.pipelines.architectures.qwen3_next.arch import qwen3_next_arch

ARCHITECTURES = [qwen3_next_arch]
