"""Registration of the OlmoForCausalLM architecture."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.olmo.config import config_from_gguf
from max.pipelines.architectures.olmo.model import OlmoModel

olmo_arch = decoder_architecture("OlmoForCausalLM", ["allenai/OLMo-1B-0724-hf"], OlmoModel,
                                 gguf_architectures=["olmo"], config_from_gguf=config_from_gguf)
