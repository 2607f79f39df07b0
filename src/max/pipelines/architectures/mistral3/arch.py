"""Registration of the Mistral 3 architecture (images + text in, text out; float weights)."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.mistral3.config import ARCHITECTURE
from max.pipelines.architectures.mistral3.model import Mistral3Model
from max.pipelines.architectures.mistral3.processor import Mistral3Tokenizer

mistral3_arch = decoder_architecture(
    ARCHITECTURE, ["mistralai/Mistral-Small-3.1-24B-Instruct-2503"], Mistral3Model,
    encodings=["float32", "bfloat16", "float16"], tokenizer=Mistral3Tokenizer)
