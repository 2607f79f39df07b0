"""Registration of the Granite 3 architecture."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.granite.config import config_from_gguf
from max.pipelines.architectures.granite.model import GraniteModel

granite_arch = decoder_architecture("GraniteForCausalLM", ["ibm-granite/granite-3.3-2b-instruct"], GraniteModel,
                                    gguf_architectures=["granite"], config_from_gguf=config_from_gguf)
