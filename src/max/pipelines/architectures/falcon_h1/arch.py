"""Registration of the Falcon-H1 architecture."""

from max.pipelines.architectures.common.arch import GGML_ENCODINGS, decoder_architecture
from max.pipelines.architectures.falcon_h1.config import config_from_gguf
from max.pipelines.architectures.falcon_h1.model import FalconH1Model

falcon_h1_arch = decoder_architecture("FalconH1ForCausalLM", ["tiiuae/Falcon-H1-0.5B-Instruct"], FalconH1Model,
                                      encodings=GGML_ENCODINGS, gguf_architectures=["falcon-h1"],
                                      config_from_gguf=config_from_gguf)
