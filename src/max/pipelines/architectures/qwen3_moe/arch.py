"""Registration of the Qwen3-MoE architecture."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.qwen3_moe.config import config_from_gguf
from max.pipelines.architectures.qwen3_moe.model import Qwen3MoeModel

qwen3_moe_arch = decoder_architecture("Qwen3MoeForCausalLM", ["Qwen/Qwen3-30B-A3B"], Qwen3MoeModel,
                                      gguf_architectures=["qwen3moe"], config_from_gguf=config_from_gguf)
