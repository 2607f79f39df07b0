"""DeepSeek-V2 / V2-Lite (``DeepseekV2ForCausalLM``): multi-head latent attention with the compressed KV
in the paged cache and absorbed projections, and a mixture of experts with shared experts."""

from max.pipelines.architectures.deepseek_v2.arch import deepseek_v2_arch

ARCHITECTURES = [deepseek_v2_arch]
