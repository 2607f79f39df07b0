"""Registration of the Gemma 3 text architecture."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.gemma3.config import config_from_gguf
from max.pipelines.architectures.gemma3.model import Gemma3Model

gemma3_arch = decoder_architecture("Gemma3ForCausalLM", ["google/gemma-3-270m", "google/gemma-3-1b-it"], Gemma3Model,
                                   gguf_architectures=["gemma3"], config_from_gguf=config_from_gguf)
