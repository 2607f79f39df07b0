"""Registration of the Qwen3 architecture."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.qwen3.config import config_from_gguf
from max.pipelines.architectures.qwen3.model import Qwen3Model

qwen3_arch = decoder_architecture("Qwen3ForCausalLM", ["Qwen/Qwen3-0.6B"], Qwen3Model,
                                  gguf_architectures=["qwen3"], config_from_gguf=config_from_gguf)
