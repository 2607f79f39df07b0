"""Registration of the GPT-OSS architecture (safetensors, float encodings: the MXFP4 release must be
dequantised first)."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.gpt_oss.model import GptOssModel

gpt_oss_arch = decoder_architecture("GptOssForCausalLM", ["openai/gpt-oss-20b"], GptOssModel,
                                    encodings=["float32", "bfloat16", "float16"])
