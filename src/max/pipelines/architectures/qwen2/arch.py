"""Registration of the Qwen2 architecture (Qwen2, Qwen2.5, Qwen2.5-Coder)."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.qwen2.config import config_from_gguf
from max.pipelines.architectures.qwen2.model import Qwen2Model

qwen2_arch = decoder_architecture("Qwen2ForCausalLM", ["Qwen/Qwen2.5-0.5B-Instruct"], Qwen2Model,
                                  gguf_architectures=["qwen2"], config_from_gguf=config_from_gguf)
