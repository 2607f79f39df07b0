"""Registration of the Mixtral architecture."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.mixtral.config import config_from_gguf
from max.pipelines.architectures.mixtral.model import MixtralModel

mixtral_arch = decoder_architecture("MixtralForCausalLM", ["mistralai/Mixtral-8x7B-Instruct-v0.1"], MixtralModel,
                                    gguf_architectures=["llama"], config_from_gguf=config_from_gguf)
