"""Registration of the Granite 4 hybrid architecture."""

from max.pipelines.architectures.common.arch import GGML_ENCODINGS, decoder_architecture
from max.pipelines.architectures.granitemoehybrid.config import config_from_gguf
from max.pipelines.architectures.granitemoehybrid.model import GraniteMoeHybridModel

granitemoehybrid_arch = decoder_architecture("GraniteMoeHybridForCausalLM", ["ibm-granite/granite-4.0-h-tiny"],
                                             GraniteMoeHybridModel, encodings=GGML_ENCODINGS,
                                             gguf_architectures=["granitehybrid"], config_from_gguf=config_from_gguf)
