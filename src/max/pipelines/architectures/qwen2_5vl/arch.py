"""Registration of the Qwen2.5-VL architecture (images + text in, text out; float weights)."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.qwen2_5vl.config import ARCHITECTURE
from max.pipelines.architectures.qwen2_5vl.model import Qwen2_5VLModel
from max.pipelines.architectures.qwen2_5vl.processor import Qwen2VLTokenizer

qwen2_5vl_arch = decoder_architecture(
    ARCHITECTURE, ["Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct"], Qwen2_5VLModel,
    encodings=["float32", "bfloat16", "float16"], tokenizer=Qwen2VLTokenizer)
