"""Registration of the DeepSeek-V2 architecture (V2, V2-Lite, V2.5, Coder-V2)."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.deepseek_v2.config import config_from_gguf
from max.pipelines.architectures.deepseek_v2.model import DeepseekV2Model

deepseek_v2_arch = decoder_architecture("DeepseekV2ForCausalLM", ["deepseek-ai/DeepSeek-V2-Lite-Chat"],
                                        DeepseekV2Model, gguf_architectures=["deepseek2"],
                                        config_from_gguf=config_from_gguf)
