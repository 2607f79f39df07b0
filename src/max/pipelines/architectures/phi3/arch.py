"""Registration of the Phi-3 architecture (Phi-3-mini/medium, Phi-3.5-mini, Phi-4-mini)."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.phi3.config import config_from_gguf
from max.pipelines.architectures.phi3.model import Phi3Model

phi3_arch = decoder_architecture("Phi3ForCausalLM", ["microsoft/Phi-3.5-mini-instruct", "microsoft/Phi-4-mini-instruct"],
                                 Phi3Model, gguf_architectures=["phi3"], config_from_gguf=config_from_gguf)
