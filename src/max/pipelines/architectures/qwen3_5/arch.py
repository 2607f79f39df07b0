"""Registration of the Qwen3.5 text architecture."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.qwen3_5.model import Qwen3_5Model

qwen3_5_arch = decoder_architecture("Qwen3_5ForCausalLM", ["Qwen/Qwen3.5-0.8B"], Qwen3_5Model,
                                    encodings=["float32", "bfloat16", "float16"])
