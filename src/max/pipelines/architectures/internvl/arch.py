"""Registration of the InternVL architecture (images + text in, text out; float weights)."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.internvl.config import ARCHITECTURE
from max.pipelines.architectures.internvl.model import InternVLModel
from max.pipelines.architectures.internvl.processor import InternVLTokenizer

internvl_arch = decoder_architecture(
    ARCHITECTURE, ["OpenGVLab/InternVL3-1B-hf", "OpenGVLab/InternVL3-2B-hf", "OpenGVLab/InternVL2_5-1B-MPO-hf"],
    InternVLModel, encodings=["float32", "bfloat16", "float16"], tokenizer=InternVLTokenizer)
