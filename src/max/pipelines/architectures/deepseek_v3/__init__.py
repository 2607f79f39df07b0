"""DeepSeek-V3 (``DeepseekV3ForCausalLM``): DeepSeek-V2's multi-head latent attention with a mixture of
experts routed by sigmoid scores, a per-expert correction bias for the choice only, and group-limited
top-k (the best ``topk_group`` groups by the sum of their two best scores)."""

from max.pipelines.architectures.deepseek_v3.arch import deepseek_v3_arch

ARCHITECTURES = [deepseek_v3_arch]
