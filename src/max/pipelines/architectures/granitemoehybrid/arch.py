"""Registration of the Granite 4 hybrid architecture."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.granitemoehybrid.config import config_from_gguf
from max.pipelines.architectures.granitemoehybrid.model import GraniteMoeHybridModel

granitemoehybrid_arch = decoder_architecture("GraniteMoeHybridForCausalLM", ["ibm-granite/granite-4.0-h-tiny"],
                                             GraniteMoeHybridModel, encodings=["float32", "bfloat16", "float16"],
                                             gguf_architectures=["granitehybrid"], config_from_gguf=config_from_gguf)
