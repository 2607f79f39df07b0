"""Registration of the Exaone4ForCausalLM architecture."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.exaone4.config import config_from_gguf
from max.pipelines.architectures.exaone4.model import Exaone4Model

exaone4_arch = decoder_architecture("Exaone4ForCausalLM", ["LGAI-EXAONE/EXAONE-4.0-1.2B"], Exaone4Model,
                                    gguf_architectures=["exaone4"], config_from_gguf=config_from_gguf)
