"""Registration of the Llava architecture with a Pixtral vision tower (images + text in, text out)."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.llava.config import ARCHITECTURE
from max.pipelines.architectures.llava.model import LlavaPixtralModel
from max.pipelines.architectures.mistral3.processor import Mistral3Tokenizer

llava_arch = decoder_architecture(
    ARCHITECTURE, ["mistral-community/pixtral-12b"], LlavaPixtralModel,
    encodings=["float32", "bfloat16", "float16"], tokenizer=Mistral3Tokenizer)
