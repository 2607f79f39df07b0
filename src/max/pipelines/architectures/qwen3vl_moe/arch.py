"""Registration of the Qwen3-VL-MoE architecture (images and video + text in, text out; float weights)."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.qwen3vl.processor import Qwen3VLTokenizer
from max.pipelines.architectures.qwen3vl_moe.config import ARCHITECTURE
from max.pipelines.architectures.qwen3vl_moe.model import Qwen3VLMoeModel

qwen3vl_moe_arch = decoder_architecture(
    ARCHITECTURE, ["Qwen/Qwen3-VL-30B-A3B-Instruct"], Qwen3VLMoeModel,
    encodings=["float32", "bfloat16", "float16"], tokenizer=Qwen3VLTokenizer)
