"""Registration of the Llama 4 vision-language architecture (images + text in, text out; float weights)."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.llama4vision.config import ARCHITECTURE
from max.pipelines.architectures.llama4vision.model import Llama4VisionLanguageModel
from max.pipelines.architectures.llama4vision.processor import Llama4VisionTokenizer

llama4vision_arch = decoder_architecture(
    ARCHITECTURE, ["meta-llama/Llama-4-Scout-17B-16E-Instruct", "meta-llama/Llama-4-Maverick-17B-128E-Instruct"],
    Llama4VisionLanguageModel, encodings=["float32", "bfloat16", "float16"], tokenizer=Llama4VisionTokenizer)
