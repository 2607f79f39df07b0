"""Registration of the SmolLM3ForCausalLM architecture."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.smollm3.config import config_from_gguf
from max.pipelines.architectures.smollm3.model import SmolLM3Model

smollm3_arch = decoder_architecture("SmolLM3ForCausalLM", ["HuggingFaceTB/SmolLM3-3B"], SmolLM3Model,
                                    gguf_architectures=["smollm3"], config_from_gguf=config_from_gguf)
