"""Registration of the Mamba-2 architecture."""

from max.pipelines.architectures.common.arch import GGML_ENCODINGS, decoder_architecture
from max.pipelines.architectures.mamba2.config import config_from_gguf
from max.pipelines.architectures.mamba2.model import Mamba2Model

mamba2_arch = decoder_architecture("Mamba2ForCausalLM", ["state-spaces/mamba2-130m", "mistralai/Mamba-Codestral-7B-v0.1"],
                                   Mamba2Model, encodings=GGML_ENCODINGS,
                                   gguf_architectures=["mamba2"], config_from_gguf=config_from_gguf)
