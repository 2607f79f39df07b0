"""Registration of the OLMo 2 architecture."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.olmo2.config import config_from_gguf
from max.pipelines.architectures.olmo2.model import Olmo2Model

olmo2_arch = decoder_architecture("Olmo2ForCausalLM", ["allenai/OLMo-2-0425-1B-Instruct"], Olmo2Model,
                                  gguf_architectures=["olmo2"], config_from_gguf=config_from_gguf)
