"""Registration of the Llama architecture (Llama 2/3, SmolLM)."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.llama3.config import config_from_gguf
from max.pipelines.architectures.llama3.model import Llama3Model

llama_arch = decoder_architecture("LlamaForCausalLM", ["HuggingFaceTB/SmolLM2-135M-Instruct", "meta-llama/Llama-3.2-1B"],
                                  Llama3Model, gguf_architectures=["llama"], config_from_gguf=config_from_gguf)
