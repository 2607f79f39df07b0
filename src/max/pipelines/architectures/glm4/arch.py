"""Registration of the Glm4ForCausalLM architecture."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.glm4.config import config_from_gguf
from max.pipelines.architectures.glm4.model import Glm4Model

glm4_arch = decoder_architecture("Glm4ForCausalLM", ["THUDM/GLM-4-9B-0414"], Glm4Model,
                                 gguf_architectures=["glm4"], config_from_gguf=config_from_gguf)
