"""Registration of the Granite MoE architecture."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.granitemoe.config import config_from_gguf
from max.pipelines.architectures.granitemoe.model import GraniteMoeModel

granitemoe_arch = decoder_architecture("GraniteMoeForCausalLM", ["ibm-granite/granite-3.1-3b-a800m-instruct"],
                                       GraniteMoeModel, gguf_architectures=["granitemoe"],
                                       config_from_gguf=config_from_gguf)
