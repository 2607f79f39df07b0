"""Registration of the Gemma 4 text architecture."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.gemma4.model import Gemma4Model

gemma4_arch = decoder_architecture("Gemma4ForCausalLM", ["google/gemma-4-31B-it"], Gemma4Model)
