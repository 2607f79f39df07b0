"""Registration of the Qwen3-VL architecture (images and video + text in, text out; float weights)."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.qwen3vl.config import ARCHITECTURE
from max.pipelines.architectures.qwen3vl.model import Qwen3VLModel
from max.pipelines.architectures.qwen3vl.processor import Qwen3VLTokenizer

qwen3vl_arch = decoder_architecture(
    ARCHITECTURE, ["Qwen/Qwen3-VL-2B-Instruct", "Qwen/Qwen3-VL-8B-Instruct"], Qwen3VLModel,
    encodings=["float32", "bfloat16", "float16"], tokenizer=Qwen3VLTokenizer)
