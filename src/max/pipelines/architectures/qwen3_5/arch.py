"""Registration of the Qwen3.5 text architecture."""

from max.pipelines.architectures.common.arch import GGML_ENCODINGS, decoder_architecture
from max.pipelines.architectures.qwen3_5.config import config_from_gguf
from max.pipelines.architectures.qwen3_5.model import Qwen3_5Model

qwen3_5_arch = decoder_architecture("Qwen3_5ForCausalLM", ["Qwen/Qwen3.5-0.8B"], Qwen3_5Model,
                                    encodings=GGML_ENCODINGS, gguf_architectures=["qwen35"],
                                    config_from_gguf=config_from_gguf)
