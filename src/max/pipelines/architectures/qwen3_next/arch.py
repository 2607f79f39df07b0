"""Registration of the Qwen3-Next architecture."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.qwen3_next.model import Qwen3NextModel

qwen3_next_arch = decoder_architecture("Qwen3NextForCausalLM", ["Qwen/Qwen3-Next-80B-A3B-Instruct"], Qwen3NextModel,
                                       encodings=["float32", "bfloat16", "float16"])
