"""Registration of the Qwen3-Next architecture."""

from max.pipelines.architectures.common.arch import GGML_ENCODINGS, decoder_architecture
from max.pipelines.architectures.qwen3_next.config import config_from_gguf
from max.pipelines.architectures.qwen3_next.model import Qwen3NextModel

qwen3_next_arch = decoder_architecture("Qwen3NextForCausalLM", ["Qwen/Qwen3-Next-80B-A3B-Instruct"], Qwen3NextModel,
                                       encodings=GGML_ENCODINGS, gguf_architectures=["qwen3next"],
                                       config_from_gguf=config_from_gguf)
