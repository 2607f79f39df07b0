"""Registration of the Gemma 3 multimodal architecture (images + text in, text out; float weights)."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.gemma3multimodal.config import ARCHITECTURE
from max.pipelines.architectures.gemma3multimodal.model import Gemma3MultimodalModel
from max.pipelines.lib.tokenizer import TextAndVisionTokenizer

gemma3multimodal_arch = decoder_architecture(
    ARCHITECTURE, ["google/gemma-3-4b-it", "google/gemma-3-12b-it", "google/gemma-3-27b-it"], Gemma3MultimodalModel,
    encodings=["float32", "bfloat16", "float16"], tokenizer=TextAndVisionTokenizer)
