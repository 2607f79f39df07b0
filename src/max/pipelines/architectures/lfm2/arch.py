"""Registration of the LFM2 architecture."""

from max.pipelines.architectures.common.arch import GGML_ENCODINGS, decoder_architecture
from max.pipelines.architectures.lfm2.config import config_from_gguf
from max.pipelines.architectures.lfm2.model import Lfm2Model

lfm2_arch = decoder_architecture("Lfm2ForCausalLM", ["LiquidAI/LFM2-350M", "LiquidAI/LFM2-1.2B"], Lfm2Model,
                                 encodings=GGML_ENCODINGS, gguf_architectures=["lfm2"],
                                 config_from_gguf=config_from_gguf)
