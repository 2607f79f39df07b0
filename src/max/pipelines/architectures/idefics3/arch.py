"""Registration of the Idefics3 architecture (images + text in, text out; float weights)."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.idefics3.config import ARCHITECTURE
from max.pipelines.architectures.idefics3.model import Idefics3Model
from max.pipelines.architectures.idefics3.processor import Idefics3Tokenizer

idefics3_arch = decoder_architecture(
    ARCHITECTURE, ["HuggingFaceTB/SmolVLM-256M-Instruct", "HuggingFaceM4/Idefics3-8B-Llama3"], Idefics3Model,
    encodings=["float32", "bfloat16", "float16"], tokenizer=Idefics3Tokenizer)
