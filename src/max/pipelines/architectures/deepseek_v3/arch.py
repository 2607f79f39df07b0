"""Registration of the DeepSeek-V3 architecture (V3, V3.1, R1)."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.deepseek_v3.model import DeepseekV3Model

deepseek_v3_arch = decoder_architecture("DeepseekV3ForCausalLM", ["deepseek-ai/DeepSeek-V3"], DeepseekV3Model)
