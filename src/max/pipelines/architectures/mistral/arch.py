"""Registration of the Mistral architecture."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.mistral.config import config_from_gguf
from max.pipelines.architectures.mistral.model import MistralModel

mistral_arch = decoder_architecture("MistralForCausalLM", ["mistralai/Mistral-7B-Instruct-v0.3"], MistralModel,
                                    gguf_architectures=["mistral"], config_from_gguf=config_from_gguf)
